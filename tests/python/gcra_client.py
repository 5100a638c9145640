"""cellrate's GCRA and RL.THROTTLE driven by two client libraries from PyPI: redis-py sends
GCRA (as Redis 8.8's clients do), valkey-py sends RL.THROTTLE (valkey-io/valkey#4081).

Usage: gcra_client.py HOST:PORT. Prints one JSON object of what each library saw over
RESP2 and RESP3; the Rust test asserts on it.
"""

import json
import sys

import redis
import valkey

host, port = sys.argv[1].rsplit(":", 1)
out = {}
for protocol in (2, 3):
    r = redis.Redis(host=host, port=int(port), protocol=protocol, socket_timeout=10)
    key = f"gcra:{protocol}"
    seen = {}
    # 10 per hour, burst 5: 360 s apart; nothing comes back while the test runs.
    seen["first"] = r.execute_command("GCRA", key, 5, 10, 3600)
    seen["peek"] = r.execute_command("GCRA", key, 5, 10, 3600, "TOKENS", 0)
    seen["heavy"] = r.execute_command("GCRA", key, 5, 10, 3600.0, "TOKENS", 3)
    pipe = r.pipeline(transaction=False)
    for _ in range(3):
        pipe.execute_command("GCRA", key, 5, 10, 3600)
    seen["pipelined"] = pipe.execute()
    try:
        r.execute_command("GCRA", key, 5, 10, "nan")
        seen["error"] = None
    except redis.ResponseError as e:
        seen["error"] = str(e)
    r.close()

    v = valkey.Valkey(host=host, port=int(port), protocol=protocol, socket_timeout=10)
    key = f"rl:{protocol}"
    seen["rl_first"] = v.execute_command("RL.THROTTLE", key, 15, 30, 3600)
    seen["rl_heavy"] = v.execute_command("RL.THROTTLE", key, 15, 30, 3600, 20)
    try:
        v.execute_command("RL.THROTTLE", key, 15, 30)
        seen["rl_error"] = None
    except valkey.ResponseError as e:
        seen["rl_error"] = str(e)
    v.close()
    out[f"resp{protocol}"] = seen
print(json.dumps(out))
