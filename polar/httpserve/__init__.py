"""What both HTTP servers (the gateway and ``polar serve``) share, below both of them and above the wire codecs.

- ``body``: reading a request body under a size limit (a ``PayloadTooLarge`` past it), as bytes or as guarded
  JSON (``polar.wire.json_guard``), and the JSON response serialised by orjson.
- ``guard``: ``BodyGuard``, credentials and the body limit decided from a request's headers, before its body.
- ``header_timeout``: a deadline on each request's headers (uvicorn's own timeout covers only keep-alive idling).
"""
