"""The peer side of ``bench.peer_cpu``: the same conversation through LangGraph with ``DynamoDBSaver``.

Run by the bench-only venv's python (``.venv-peer``, from ``bench/peer-requirements.txt``), never by the
development venv, and never importing stepagent. Usage::

    python bench/peers/langgraph_turns.py --endpoint URL --spec conversation.json --out result.json

The spec (written by :mod:`bench.peer_cpu`) gives the turns' user texts, the model's acknowledgement and
answer, and the tool result's size, so both sides run the same conversation. One turn is one
``graph.invoke``: the user text → a model node whose deterministic reply asks for one ``lookup`` call →
LangGraph's prebuilt ``ToolNode`` runs it (~1 KB result) → the model node answers (~1 KB). The graph is
checkpointed by ``langgraph-checkpoint-aws``'s ``DynamoDBSaver`` (table with ``PK``/``SK`` keys, S3 offload
to a bucket), both created on the given moto server before anything is timed.

What is measured: ``time.process_time()`` (every thread of this process, so LangGraph's background
checkpoint writes count) around each ``invoke``; the result is the per-turn CPU in milliseconds. Client
creation, table and bucket creation and interpreter start are outside the measured window.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time
import uuid
from typing import Any

import boto3
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph_checkpoint_aws import DynamoDBSaver


def build_graph(spec: dict[str, Any], saver: Any) -> Any:
    calls = 0

    chars = int(spec["result_chars"])

    def lookup(query: str) -> str:
        """Look something up."""
        nonlocal calls
        calls += 1
        return "result: " + (f"{calls:07d}" * (chars // 7 + 1))[:chars]

    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=spec["answer"])]}
        call = {"name": "lookup", "args": {"query": spec["thread"]}, "id": f"call-{uuid.uuid4().hex[:12]}"}
        return {"messages": [AIMessage(content=spec["ack"], tool_calls=[call])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    graph.add_edge("model", END)
    return graph.compile(checkpointer=saver)


def create_resources(endpoint: str, table: str, bucket: str) -> None:
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "PK", "AttributeType": "S"},
            {"AttributeName": "SK", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.spec, encoding="utf-8") as handle:
        spec = json.load(handle)
    suffix = uuid.uuid4().hex[:8]
    table, bucket = f"peer-checkpoints-{suffix}", f"peer-checkpoints-{suffix}"
    create_resources(args.endpoint, table, bucket)
    saver = DynamoDBSaver(
        table_name=table,
        region_name="us-east-1",
        endpoint_url=args.endpoint,
        s3_offload_config={"bucket_name": bucket, "endpoint_url": args.endpoint},
    )
    graph = build_graph(spec, saver)
    config = {"configurable": {"thread_id": spec["thread"]}}
    cpu_ms: list[float] = []
    messages = 0
    for text in spec["user_texts"]:
        start = time.process_time()
        state = graph.invoke({"messages": [HumanMessage(content=text)]}, config)
        cpu_ms.append((time.process_time() - start) * 1000)
        messages = len(state["messages"])
        assert state["messages"][-1].content == spec["answer"], "the turn did not end with the answer"
    with open(args.out, "w", encoding="utf-8") as handle:
        versions = {
            name: importlib.metadata.version(name)
            for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-aws", "boto3", "botocore")
        }
        json.dump({"cpu_ms": cpu_ms, "messages": messages, "versions": versions}, handle)


if __name__ == "__main__":
    main()
