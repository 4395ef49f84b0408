"""The tiny model's OpenClaw variant, shipped inside the package so that the first `local` chats at once.

Stage: embedded stack, model set-up (before the engine starts). `local`'s default model is the tiny
model pre-trained a second time on OpenClaw-shaped prompts of 3.7K-15.8K tokens (`pretrain.py`); that
build takes 9-13 minutes on 2 cores, which a new user met as the first thing the README's command did.
The build is deterministic from its seeds, so the project runs it once and ships the result here
(~4 MB: the 3.7 MB of safetensors and the 0.3 MB tokenizer); `ensure_tiny_model` copies it into the cache
instead of building, after checking every file against ``SHA256SUMS``. A directory whose name does not
match today's format and phase versions is never used (the name carries them), and
``OPENCLAW_RL_BUILD_TINY=1`` builds locally anyway. Regenerate after a version bump with
``python -m openclaw_rl.embedded.shipped_model`` (it builds from scratch and rewrites this directory).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

SHIPPED_DIR = Path(__file__).with_name("shipped")
SUMS_FILE = "SHA256SUMS"
BUILD_ENV = "OPENCLAW_RL_BUILD_TINY"


def _sums(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != SUMS_FILE}


def shipped_copy(name: str) -> Path | None:
    """The shipped build named ``name`` (a cache directory's name), if there is one, intact, and not
    overridden by ``OPENCLAW_RL_BUILD_TINY=1``."""
    src = SHIPPED_DIR / name
    if os.environ.get(BUILD_ENV, "").strip() in ("1", "true", "yes") or not (src / SUMS_FILE).is_file():
        return None
    expected = dict(line.split("  ", 1)[::-1] for line in (src / SUMS_FILE).read_text().splitlines() if line)
    if _sums(src) != expected:
        print(f"openclaw-rl: the shipped tiny model {name} fails its checksums; building it instead", file=sys.stderr)
        return None
    return src


def copy_shipped(src: Path, dest: Path) -> None:
    """Copy a shipped build's files (not its checksum list) into ``dest``."""
    for path in src.iterdir():
        if path.is_file() and path.name != SUMS_FILE:
            shutil.copyfile(path, dest / path.name)


def ship(built: Path | None = None, seed: int = 0) -> Path:
    """Write the OpenClaw variant, with its checksums, under ``SHIPPED_DIR``: ``built`` (a finished build
    of today's name, e.g. from the cache) or a build from scratch."""
    from openclaw_rl.embedded.tiny_model import MARKER_FILE, build_tiny_model, tiny_model_path

    name = tiny_model_path(seed=seed, openclaw=True).name
    with tempfile.TemporaryDirectory() as tmp:
        if built is None:
            built = Path(tmp)
            build_tiny_model(built, seed=seed, openclaw=True, log=print)
        elif built.name != name or not (built / MARKER_FILE).is_file():
            raise SystemExit(f"{built} is not a finished build named {name}")
        shutil.rmtree(SHIPPED_DIR, ignore_errors=True)
        dest = SHIPPED_DIR / name
        dest.mkdir(parents=True)
        copy_shipped(built, dest)
    (dest / SUMS_FILE).write_text("".join(f"{digest}  {file}\n" for file, digest in _sums(dest).items()))
    return dest


if __name__ == "__main__":  # python -m openclaw_rl.embedded.shipped_model [BUILT_DIR]
    print(f"shipped: {ship(Path(sys.argv[1]) if len(sys.argv) > 1 else None)}")
