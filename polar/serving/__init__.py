"""An SGLang-compatible HTTP server for the local model (``polar serve-model``).

``polar.serving.sglang_app.create_app(engine, served_model_name=...)`` builds the FastAPI app and ``serve(host,
port, engine, ...)`` runs it under uvicorn; ``polar.serving.threaded.ServerThread`` runs an app on a background
thread (tests, embedding). Nothing is imported here: the model server needs torch, and ``polar.serving.launch``
(the command's flags, which every ``polar`` command's parser adds) must not pull it into a gateway or a CLI call.
"""
