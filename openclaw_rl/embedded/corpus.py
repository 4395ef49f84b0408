"""A seeded synthetic corpus for training the tiny BPE tokenizer.

The tokenizer should split agent traffic (prose, code, tool-call JSON, think blocks, emoji) into
sensible pieces, so the corpus mixes all of those. Templated prose alone saturates after a few hundred
merges, so a Zipf-distributed lexicon of syllable pseudo-words supplies the long tail that lets BPE
reach its full vocabulary. OpenClaw-shaped documents (policy-style system prompts, JSON-schema tools,
timestamped user messages, internal-context blocks; `openclaw_like.py`) make its ~51K-character prompt
tokenise to about half the tokens a prose-only vocabulary needs. Everything is generated from one `random.Random(seed)`, so the same seed
always gives the same text and no data file has to ship with the package.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from itertools import accumulate

from openclaw_rl.embedded import openclaw_like

OPENCLAW_WEIGHT = 8

_NAMES = ("Alice", "Bob", "Carol", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal",
          "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Yusuf")
_NOUNS = ("report", "server", "garden", "meeting", "invoice", "river", "kitchen", "project", "ticket",
          "library", "model", "dataset", "window", "bridge", "letter", "market", "station", "budget",
          "camera", "battery", "schedule", "message", "folder", "request", "answer", "question", "city",
          "weather", "forecast", "recipe", "account", "password", "network", "service", "function")
_ADJECTIVES = ("quick", "quiet", "bright", "heavy", "simple", "broken", "careful", "empty", "useful",
               "strange", "recent", "final", "small", "large", "public", "private", "early", "late",
               "green", "warm", "cold", "clear", "complex", "stable", "noisy", "gentle", "ancient")
_VERBS = ("checked", "opened", "moved", "wrote", "fixed", "found", "sent", "built", "read", "cleaned",
          "updated", "deleted", "planned", "tested", "shared", "carried", "measured", "painted", "saved")
_VERBS_BASE = ("check", "open", "move", "write", "fix", "find", "send", "build", "read", "clean",
               "update", "delete", "plan", "test", "share", "carry", "measure", "paint", "save", "search")
_PLACES = ("in the office", "near the station", "at home", "on the server", "in the garden",
           "by the river", "in the cloud", "at the market", "in Paris", "in Tokyo", "in Berlin",
           "in New York", "in Lagos", "in São Paulo", "under the bridge", "on the roof")
_TIMES = ("yesterday", "this morning", "last week", "on Monday", "before lunch", "after midnight",
          "every day", "in March", "at 9:30", "two hours ago", "tomorrow", "right now")
_TEMPLATES = (
    "{name} {verb} the {adj} {noun} {place} {time}.",
    "The {noun} was {adj}, so {name} {verb} it {time}.",
    "Could you {base} the {noun} {place}?",
    "I think {name} {verb} the {adj} {noun} {time}.",
    "Why did {name} {base} the {noun}? Nobody knows.",
    "{time}, {name} and {name2} {verb} a {adj} {noun}.",
    "Sure! Here is the {adj} {noun} you asked for.",
    "Let me {base} the {noun} first, then I will {base2} the {noun2}.",
    "The {noun} costs ${num}.{cents} and the {noun2} costs ${num2}.",
    "It is {num} degrees {place}, and the sky is {adj}.",
    "Note: the {noun} ({adj}) is {num}% complete; see section {num2}.",
    "\"Is the {noun} {adj}?\" asked {name}. \"Yes,\" said {name2}.",
    "Hello {name}, how are you today? What can I do for you?",
    "What is {num} plus {num2}? The answer is {num3}.",
    "Thanks, that works! Please {base} my {noun} and tell me what you find.",
    "I'm sorry, I can't {base} the {noun} because it's {adj}. We'll try again {time}.",
)
_TOOLS: dict[str, Callable[[random.Random], dict]] = {
    "get_weather": lambda r: {"city": r.choice(("Paris", "Tokyo", "Berlin", "Lima", "Oslo", "Cairo"))},
    "search_web": lambda r: {"query": f"{r.choice(_ADJECTIVES)} {r.choice(_NOUNS)}", "limit": r.randint(1, 20)},
    "read_file": lambda r: {"path": f"/home/user/{r.choice(_NOUNS)}/{r.choice(_NOUNS)}.txt"},
    "write_file": lambda r: {"path": f"./{r.choice(_NOUNS)}.md", "content": f"# {r.choice(_NOUNS).title()}\n"},
    "run_command": lambda r: {"command": r.choice(("ls -la", "git status", "pytest -q", "df -h", "whoami"))},
    "send_message": lambda r: {"to": r.choice(_NAMES), "text": f"The {r.choice(_NOUNS)} is ready."},
    "calculate": lambda r: {"expression": f"{r.randint(1, 999)} * {r.randint(1, 99)} + {r.randint(0, 9)}"},
    "create_event": lambda r: {"title": r.choice(_NOUNS), "date": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                               "attendees": r.sample(_NAMES, 2)},
}
_UNICODE = ("café", "naïve", "Straße", "façade", "jalapeño", "Zürich", "smørrebrød", "crème brûlée",
            "Привет, мир", "спасибо", "Καλημέρα", "ευχαριστώ", "你好，世界", "谢谢", "天气很好",
            "こんにちは", "ありがとう", "안녕하세요", "감사합니다", "مرحبا بالعالم", "שלום", "नमस्ते",
            "ขอบคุณ", "xin chào", "🙂", "🚀", "🎉", "✅", "🔥", "👍", "❤️", "😂", "🤖", "📁", "⚠️", "→", "≤",
            "≥", "∑", "π", "°C", "€", "£", "¥", "—", "…", "«»", "│", "└──", "├──")
_ONSETS = ("", "b", "br", "c", "ch", "d", "dr", "f", "fl", "g", "gr", "h", "j", "k", "kl", "l", "m", "n",
           "p", "pr", "qu", "r", "s", "sh", "sk", "st", "t", "th", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "y", "io")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "x", "nd", "st", "ck", "ng")


class _Writer:
    """Holds the seeded RNG and pseudo-word lexicon; each method writes one document of one kind."""

    def __init__(self, seed: int, lexicon_size: int = 6000):
        self.rng = rng = random.Random(seed)
        syllables = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]
        self.lexicon = ["".join(rng.choices(syllables, k=rng.choice((1, 2, 2, 3, 3, 4))))
                        for _ in range(lexicon_size)]
        # Zipf weights: the head gets merged into whole-word tokens, the tail into syllables.
        self.cum_weights = list(accumulate(1.0 / (rank + 1) for rank in range(lexicon_size)))

    def words(self, k: int) -> list[str]:
        return self.rng.choices(self.lexicon, cum_weights=self.cum_weights, k=k)

    def sentence(self) -> str:
        r = self.rng
        return r.choice(_TEMPLATES).format(
            name=r.choice(_NAMES), name2=r.choice(_NAMES), verb=r.choice(_VERBS), adj=r.choice(_ADJECTIVES),
            noun=r.choice(_NOUNS), noun2=r.choice(_NOUNS), place=r.choice(_PLACES), time=r.choice(_TIMES),
            base=r.choice(_VERBS_BASE), base2=r.choice(_VERBS_BASE), num=r.randint(0, 120),
            num2=r.randint(1, 64), num3=r.randint(1, 200), cents=f"{r.randint(0, 99):02d}",
        )

    def prose(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 6))) + "\n"

    def pseudo(self) -> str:
        lines = []
        for _ in range(self.rng.randint(1, 4)):
            text = " ".join(self.words(self.rng.randint(6, 18)))
            lines.append(text[0].upper() + text[1:] + self.rng.choice((".", ".", "?", "!", ",", ":")))
        return "\n".join(lines) + "\n"

    def python(self) -> str:
        r = self.rng
        name = f"{r.choice(_VERBS_BASE)}_{r.choice(_NOUNS)}"
        arg, other, var = r.choice(_NOUNS), r.choice(self.lexicon), self.words(1)[0]
        body = r.choice((
            f"    {var} = [x * {r.randint(2, 9)} for x in {arg} if x > {r.randint(0, 9)}]\n    return {var}\n",
            f"    {var} = {{}}\n    for key, value in {arg}.items():\n        {var}[key] = value + {other}\n"
            f"    return {var}\n",
            f"    if not {arg}:\n        raise ValueError(\"empty {arg}\")\n    return len({arg}) / {other}\n",
            f"    with open({arg}, \"r\", encoding=\"utf-8\") as f:\n        {var} = f.read()\n"
            f"    return {var}.strip().split(\"\\n\")\n",
            f"    try:\n        {var} = int({arg})\n    except (TypeError, ValueError):\n        {var} = None\n"
            f"    return {var}\n",
        ))
        doc = f'    """{r.choice(_VERBS_BASE).title()} the {r.choice(_ADJECTIVES)} {arg}."""\n'
        head = r.choice(("", "import os\n\n", "from pathlib import Path\n\n", "import json\n\n", "# TODO: tidy\n"))
        return f"{head}def {name}({arg}, {other}={r.randint(0, 10)}):\n{doc}{body}\n"

    def tool_call(self) -> str:
        name = self.rng.choice(list(_TOOLS))
        payload = {"name": name, "arguments": _TOOLS[name](self.rng)}
        compact = self.rng.random() < 0.25  # models often emit JSON without spaces
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":") if compact else None)
        return f"<tool_call>\n{text}\n</tool_call>\n"

    def tool_response(self) -> str:
        r = self.rng
        result = r.choice((
            {"temperature": r.randint(-10, 35), "unit": "celsius", "condition": r.choice(_ADJECTIVES)},
            {"results": [{"title": f"{r.choice(_ADJECTIVES)} {r.choice(_NOUNS)}", "url": f"https://{r.choice(self.lexicon)}.com"}]},
            {"ok": r.random() < 0.8, "stdout": " ".join(self.words(4)), "exit_code": r.randint(0, 2)},
            {"error": f"{r.choice(_NOUNS)} not found", "code": r.choice((404, 500, 403))},
        ))
        return f"<tool_response>\n{json.dumps(result, ensure_ascii=False)}\n</tool_response>\n"

    def think(self) -> str:
        r = self.rng
        steps = " ".join(r.choice((
            f"The user wants the {r.choice(_NOUNS)}.", f"I should {r.choice(_VERBS_BASE)} it first.",
            f"Maybe {r.choice(_NAMES)} already {r.choice(_VERBS)} the {r.choice(_NOUNS)}.",
            "Wait, let me double-check that.", f"So the answer is {r.randint(0, 500)}.",
        )) for _ in range(r.randint(2, 5)))
        after = self.tool_call() if r.random() < 0.4 else self.sentence() + "\n"
        return f"<think>\n{steps}\n</think>\n\n{after}"

    def openclaw(self) -> str:
        return openclaw_like.corpus_document(self.rng)

    def unicode(self) -> str:
        parts = self.rng.choices(_UNICODE, k=self.rng.randint(3, 9)) + self.words(self.rng.randint(0, 3))
        self.rng.shuffle(parts)
        return " ".join(parts) + "\n"


# Document kinds and their relative frequency.
_KINDS: tuple[tuple[Callable[[_Writer], str], int], ...] = (
    (_Writer.prose, 6), (_Writer.pseudo, 1), (_Writer.python, 3), (_Writer.tool_call, 2),
    (_Writer.tool_response, 2), (_Writer.think, 2), (_Writer.unicode, 2), (_Writer.openclaw, OPENCLAW_WEIGHT),
)


def generate_corpus(seed: int = 0, target_bytes: int = 1_600_000) -> list[str]:
    """Return documents (multi-line strings) totalling at least `target_bytes` of UTF-8, same for same seed."""
    writer = _Writer(seed)
    kinds = [kind for kind, _ in _KINDS]
    cum = list(accumulate(weight for _, weight in _KINDS))
    docs: list[str] = []
    size = 0
    while size < target_bytes:
        for kind in writer.rng.choices(kinds, cum_weights=cum, k=256):
            doc = kind(writer)
            docs.append(doc)
            size += len(doc.encode("utf-8"))
    return docs
