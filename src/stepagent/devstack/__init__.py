"""The embedded development stack behind ``stepagent run``: a moto server on loopback (or LocalStack via
``AWS_ENDPOINT_URL``) with the resources of ``template.yaml``, local stand-ins for Lambda's SQS event source,
the demo RAP tool server, and the chat loop.

Development only: nothing in the runtime imports it, and Lambda never loads it.
"""
