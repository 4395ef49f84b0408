#!/usr/bin/env python3
"""Capture streamed /generate exchanges with a per-request ``sampling_params.stream_interval`` from a running
SGLang server (0.5.23, CPU). Usage: capture_stream_interval.py BASE_URL OUT_JSONL MODEL_DIR LABEL

LABEL ("cumulative" or "incremental") names the server's streaming mode in each exchange's name. The same
requests run at intervals 1, 4 and 5, with log-probs, so the shapes can be compared token for token."""
import http.client
import json
import sys
import time
import urllib.parse

from transformers import AutoTokenizer

BASE, OUT, MODEL_DIR, LABEL = sys.argv[1:5]
u = urllib.parse.urlparse(BASE)
tok = AutoTokenizer.from_pretrained(MODEL_DIR)
IM_END = tok.convert_tokens_to_ids("<|im_end|>")
MSGS = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"}]
enc = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True)
PROMPT = list(enc["input_ids"]) if hasattr(enc, "keys") else list(enc)
rows = []


def stream(name, body, notes):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    t0 = time.time()
    conn.request("POST", "/generate", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    lines = [line.rstrip("\r") for line in r.read().decode("utf-8").split("\n")[:-1]]  # every line, as capture.py
    conn.close()
    rows.append({"name": f"{LABEL}_{name}", "method": "POST", "path": "/generate", "request_json": body,
                 "status": r.status, "response_headers": {"content-type": r.getheader("content-type")},
                 "sse_lines": lines, "elapsed_s": round(time.time() - t0, 3), "notes": notes})
    print(name, r.status, sum(1 for x in lines if x.startswith("data: {")), "events", flush=True)


for interval in (1, 4, 5):
    sp = {"temperature": 1.0, "max_new_tokens": 11, "ignore_eos": True, "sampling_seed": 7}
    if interval != 1:
        sp["stream_interval"] = interval
    stream(f"interval{interval}_len11_logprob", {"input_ids": PROMPT, "sampling_params": sp, "stream": True,
                                                 "return_logprob": True},
           f"server {LABEL}; stream_interval {interval}; 11 tokens, finish length; seeded so the intervals sample alike")
# up to 24 tokens with the eos as a stop token: the finish may come between two interval boundaries
stream("interval8_stop_token", {"input_ids": PROMPT, "sampling_params": {
    "temperature": 1.0, "max_new_tokens": 24, "sampling_seed": 11, "stop_token_ids": [IM_END], "stream_interval": 8,
    "skip_special_tokens": False}, "stream": True, "return_logprob": True},
       f"server {LABEL}; stream_interval 8, up to 24 tokens with a stop token")
stream("interval3_no_logprob", {"input_ids": PROMPT, "sampling_params": {
    "temperature": 1.0, "max_new_tokens": 7, "ignore_eos": True, "sampling_seed": 3, "stream_interval": 3},
    "stream": True}, f"server {LABEL}; stream_interval 3, 7 tokens, no log-probs")
with open(OUT, "a") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
