"""``codec.dumps`` writes an ``array.array`` of token ids (a ``Turn``'s prompt ids, sent to ``/generate`` as they
are) as exactly the JSON list of its values, with orjson and with the ``json`` fallback."""

from __future__ import annotations

import json
import random
from array import array

import pytest

from openclaw_rl import codec


@pytest.mark.parametrize("fallback", [False, True], ids=["orjson", "json"])
def test_an_array_is_written_as_the_list_of_its_values(monkeypatch, fallback):
    if fallback:
        monkeypatch.setattr(codec, "orjson", None)
    rng = random.Random(7)
    for n in (0, 1, 7, 8192):
        ids = [rng.randrange(-2**31, 2**31) for _ in range(n)]
        body = {"input_ids": array("i", ids), "sampling_params": {"temperature": 1.0}, "text": "caf\u00e9"}
        assert codec.dumps(body) == codec.dumps({**body, "input_ids": ids})
        assert json.loads(codec.dumps(body))["input_ids"] == ids
    floats = array("d", [0.5, -1.25, 0.0])
    assert json.loads(codec.dumps({"x": floats})) == {"x": [0.5, -1.25, 0.0]}
    # the json fallback of a string orjson refuses keeps the array too
    assert json.loads(codec.dumps({"x": array("i", [3, 4]), "s": "\ud800"}).decode("utf-8", "surrogatepass"))["x"] == [3, 4]


def test_other_unknown_types_are_still_refused():
    with pytest.raises(TypeError):
        codec.dumps({"x": object()})
