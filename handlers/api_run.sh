#!/bin/sh
# ApiFunction's entry point: the AWS Lambda Web Adapter layer (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap)
# starts this, then relays the Function URL's requests to the server on $PORT, streaming its responses.
PYTHONPATH="$LAMBDA_TASK_ROOT:/opt/python:$LAMBDA_RUNTIME_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  exec python3 -m uvicorn --host 127.0.0.1 --port "${PORT:-8080}" --no-access-log --lifespan off api:app
