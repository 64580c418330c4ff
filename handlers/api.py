"""The HTTP API for applications (ASGI), run by uvicorn under the AWS Lambda Web Adapter (api_run.sh);
see :mod:`stepagent.api.lambda_app`."""

from stepagent.api.lambda_app import app

__all__ = ["app"]
