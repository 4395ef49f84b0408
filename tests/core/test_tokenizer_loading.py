"""The proxy loads a generic `tokenizers` tokenizer by its named class instead of through AutoTokenizer
(which imports torch first): the same tokenizer, exactly, without torch in the proxy process."""

from __future__ import annotations

import json
import subprocess
import sys

from support import load_conversation

from openclaw_rl.server import GENERIC_TOKENIZER_CLASSES, _named_tokenizer_class, load_tokenizer


def test_direct_load_equals_autotokenizer_on_openclaw_traffic(tiny_model_dir, tokenizer):
    direct = load_tokenizer(str(tiny_model_dir))
    assert _named_tokenizer_class(str(tiny_model_dir)) in GENERIC_TOKENIZER_CLASSES
    assert type(direct) is type(tokenizer) and len(direct) == len(tokenizer)
    assert direct.chat_template == tokenizer.chat_template
    assert direct.get_added_vocab() == tokenizer.get_added_vocab()
    assert direct.all_special_tokens == tokenizer.all_special_tokens
    assert (direct.eos_token_id, direct.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    for name in ("conversation_A.jsonl", "conversation_B.jsonl"):
        for row in load_conversation(name):
            body = row["body"]
            texts = [t.apply_chat_template(body["messages"], tools=body.get("tools"), tokenize=False,
                                           add_generation_prompt=True) for t in (direct, tokenizer)]
            assert texts[0] == texts[1]
            assert direct.encode(texts[0], add_special_tokens=False) == tokenizer.encode(texts[1], add_special_tokens=False)


def test_the_proxy_process_loads_its_tokenizer_without_torch(tiny_model_dir):
    code = ("import sys; from openclaw_rl.server import load_tokenizer; "
            f"t = load_tokenizer({json.dumps(str(tiny_model_dir))}); "
            "print(len(t), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False", out.stdout
