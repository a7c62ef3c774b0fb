"""Load generator for the compose fleet: multi-turn chats through kvroute's OpenAI proxy.

Each session keeps a shared system prompt plus its own growing history, so the router's
cache-aware routing has prefixes to reuse; bounded in rate, runs until stopped (or, with
``KVROUTE_LOADGEN_REQUESTS=N``, sends N requests and exits non-zero if any failed: how
the tests run it against real processes).
"""

import os
import random
import time

from openai import OpenAI

URL = os.environ.get("KVROUTE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("KVROUTE_MODEL", "kvroute-sim")
RATE = float(os.environ.get("KVROUTE_RPS", "4"))
LIMIT = int(os.environ.get("KVROUTE_LOADGEN_REQUESTS", "0"))  # 0: until stopped
WORDS = ["kabe", "dodo", "fifu", "hali", "mopa", "suvo", "zuzu", "lolo", "pela", "wiko"]

# The router's key when it has one (KVROUTE_API_KEY, as the router reads it).
client = OpenAI(
    base_url=URL, api_key=os.environ.get("KVROUTE_API_KEY", "unused"), max_retries=2, timeout=60
)
rng = random.Random(0)
systems = [" ".join(rng.choices(WORDS, k=300)) for _ in range(3)]
sessions: list[list[dict[str, str]]] = []
sent = failed = 0
while not LIMIT or sent < LIMIT:
    sent += 1
    if len(sessions) < 16 or rng.random() < 0.1:
        sessions.append([{"role": "system", "content": rng.choice(systems)}])
        sessions = sessions[-64:]
    history = rng.choice(sessions)
    history.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=40))})
    try:
        reply = client.chat.completions.create(model=MODEL, messages=history, max_tokens=32)
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    except Exception as exc:  # keep generating: the dashboard shows the failures
        failed += 1
        print(f"loadgen: {exc}", flush=True)
    if len(history) > 24:
        sessions.remove(history)
    time.sleep(1 / RATE)
print(f"loadgen: {sent} requests, {failed} failed", flush=True)
raise SystemExit(1 if failed else 0)
