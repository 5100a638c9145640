"""cellrate's Redis-protocol listener driven by redis-py, as an application would use it.

Usage: resp_client.py HOST:PORT [TOKEN]. Prints one JSON object of what each protocol
version (RESP2, RESP3) answered; the Rust test asserts on it.
"""

import json
import sys

import redis

host, port = sys.argv[1].rsplit(":", 1)
token = sys.argv[2] if len(sys.argv) > 2 else None
out = {}
for protocol in (2, 3):
    r = redis.Redis(
        host=host, port=int(port), password=token, protocol=protocol, socket_timeout=10
    )
    key = f"py:{protocol}"
    seen = {"ping": r.ping()}
    # One hour per 30 tokens: nothing comes back while the test runs.
    seen["first"] = r.execute_command("CL.THROTTLE", key, 15, 30, 3600)
    seen["peek"] = r.execute_command("CL.THROTTLE", key, 15, 30, 3600, 0)
    pipe = r.pipeline(transaction=False)
    for _ in range(20):
        pipe.execute_command("CL.THROTTLE", key, 15, 30, 3600)
    seen["pipelined"] = pipe.execute()
    try:
        r.execute_command("CL.THROTTLE", key, "x", 30, 3600)
        seen["error"] = None
    except redis.ResponseError as e:
        seen["error"] = str(e)
    r.client_setname("py-client")
    seen["name"] = r.client_getname()
    out[f"resp{protocol}"] = seen
    r.close()
print(json.dumps(out, default=lambda b: b.decode()))
