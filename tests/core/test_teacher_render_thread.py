"""The scorer's hinted-prompt renders (OPD's teacher prompt, server or trainer teacher) run off the event loop.

Stage: mode scorer. A request's own prompt is rendered on the render thread (serving.py) because a ~8K render
(~1.1 ms of template and tokenising) on the loop stalls every other request; the teacher's hinted prompt is the
same size and must not do it either. Each test records which thread rendered and fails when it was the loop's."""

from __future__ import annotations

import asyncio
import threading
from array import array

from openclaw_rl.judge import HintJudgement, HintVote, TeacherScores
from openclaw_rl.turns import Generation, Turn


class _Renderer:
    """Stands for ``ChatRenderer.render``; notes the thread of every call."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def render(self, messages, tools=None, with_array=False):
        self.threads.append(threading.get_ident())
        ids = [1, 2, 3]
        return ("", ids, array("i", ids)) if with_array else ("", ids)


class _Judge:
    enabled = True

    async def hints(self, text, state):
        return HintJudgement([HintVote(1, "answer formally and politely", "")])

    async def prm(self, text, state):  # pragma: no cover - with_prm=False below
        raise AssertionError

    async def teacher_log_probs(self, prompt_ids, response_ids, top_k=0):
        return TeacherScores([-0.5] * len(response_ids))


def _turn() -> Turn:
    turn = Turn(session_key="a\x1fs", session_id="s", index=1, prompt_ids=array("i", [1, 2]),
                messages=[{"role": "user", "content": "hi"}], tools=None, sampling_temperature=1.0, epoch="e")
    turn.generation = Generation(array("i", [5, 6]), array("d", [-0.1, -0.2]), "yo", "stop", "v1")
    turn.next_state = {"role": "user", "content": "No, formally."}
    return turn


async def _on_loop(coro_fn):
    return threading.get_ident(), await coro_fn()


def test_the_server_teachers_hinted_prompt_is_rendered_off_the_event_loop():
    from openclaw_opd.teacher import teacher_signal

    renderer = _Renderer()
    loop_thread, signal = asyncio.run(_on_loop(lambda: teacher_signal(_turn(), "be formal", _Judge(), renderer)))
    assert signal.log_probs == [-0.5, -0.5]
    assert renderer.threads and loop_thread not in renderer.threads


def test_the_trainer_teachers_hinted_prompt_is_rendered_off_the_event_loop():
    from openclaw_opd.scorer import judge_with_hint

    renderer = _Renderer()
    loop_thread, result = asyncio.run(_on_loop(lambda: judge_with_hint(
        _turn(), _Judge(), renderer, with_prm=False, min_hint_chars=0, top_k=0, teacher_source="trainer")))
    assert result.teacher is not None and result.teacher.prompt_ids == [1, 2, 3]
    assert renderer.threads and loop_thread not in renderer.threads
