"""An SGLang-compatible HTTP server for the local model (``polar serve-model``).

``create_app(engine, served_model_name=...)`` builds the FastAPI app, ``serve(host, port, engine, ...)``
runs it under uvicorn, and ``ServerThread`` runs an app on a background thread (tests, embedding).
"""

from polar.serving.sglang_app import create_app, serve
from polar.serving.threaded import ServerThread

__all__ = ["ServerThread", "create_app", "serve"]
