"""A teacher server apart from the judge (openclaw_opd/teacher_server.py), and the same-tokenizer check."""

from __future__ import annotations

import logging

import pytest
from support import HINT, judge_reply, mistral_shaped_tokenizer, scripted_server, wait_for_samples
from test_opd_combine_modes import expected_teacher, talk

from openclaw_opd.teacher_server import tokenizer_mismatch


@pytest.fixture
def plain_judge(tokenizer):
    """The scripted judge's votes and hints, with log-probs that ignore the hint (-5.0 everywhere)."""
    with scripted_server(tokenizer, judge_reply, scorer=lambda prefix, token: -5.0) as server:
        yield server


@pytest.mark.parametrize("mode", ["opd", "combine"])
def test_teacher_log_probs_come_from_the_teacher_url(policy_server, plain_judge, teacher_server, make_proxy, mode):
    proxy, url = make_proxy(policy_server.url, plain_judge.url, mode=mode, judge_votes=1,
                            opd_teacher_url=teacher_server.url, opd_teacher_tokenizer="")
    talk(url, f"t-{mode}", ["hello", "that is wrong", "ok"])
    s = wait_for_samples(proxy, 1)[0]
    assert s.metadata["hint"] == HINT  # the judge's hint...
    assert s.teacher_log_probs == expected_teacher(s.response_ids)  # ...scored by the teacher server


def test_without_a_teacher_url_the_judge_is_the_teacher(policy_server, plain_judge, make_proxy):
    proxy, url = make_proxy(policy_server.url, plain_judge.url, mode="opd", judge_votes=1)
    talk(url, "j", ["hello", "that is wrong", "ok"])
    s = wait_for_samples(proxy, 1)[0]
    assert s.teacher_log_probs == [-5.0] * s.response_length


def test_a_teacher_with_another_tokenizer_is_refused(tokenizer, tiny_model_dir, tmp_path, policy_server,
                                                     teacher_server, make_proxy):
    other = mistral_shaped_tokenizer(tiny_model_dir)
    other.save_pretrained(tmp_path / "other")
    assert tokenizer_mismatch(tokenizer, tokenizer) is None
    assert "vocabulary of" in tokenizer_mismatch(tokenizer, other)
    with pytest.raises(ValueError, match="does not share the policy's tokenizer.*same tokenizer"):
        make_proxy(policy_server.url, teacher_server.url, mode="opd",
                   opd_teacher_url=teacher_server.url, opd_teacher_tokenizer=str(tmp_path / "other"))
    # the policy's own tokenizer directory passes
    make_proxy(policy_server.url, teacher_server.url, mode="opd", opd_teacher_url=teacher_server.url,
               opd_teacher_tokenizer=str(tiny_model_dir))


def test_the_tokenizer_the_teacher_server_reports_is_checked(tokenizer, tiny_model_dir, tmp_path, policy_server,
                                                             make_proxy, caplog):
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.scripted import ScriptedModel
    from openclaw_rl.servers import BackgroundServer

    other = mistral_shaped_tokenizer(tiny_model_dir)
    other.save_pretrained(tmp_path / "other")
    for path, refused in ((tmp_path / "other", True), (tiny_model_dir, False)):
        app = make_engine_app(ScriptedModel(tokenizer, responder=lambda ids: "x"), tokenizer,
                              served_model_name="teacher", model_path=str(path))
        with BackgroundServer(app) as teacher:
            if refused:
                with pytest.raises(ValueError, match=f"{teacher.url}/model_info"):
                    make_proxy(policy_server.url, teacher.url, mode="opd", opd_teacher_url=teacher.url)
            else:
                make_proxy(policy_server.url, teacher.url, mode="opd", opd_teacher_url=teacher.url)
    # a server reporting "tiny" (not a directory here): the check cannot run, which is said
    with caplog.at_level(logging.WARNING, logger="openclaw_opd.teacher_server"), \
            scripted_server(tokenizer, judge_reply) as teacher:
        make_proxy(policy_server.url, teacher.url, mode="opd", opd_teacher_url=teacher.url)
    assert "could not be compared" in caplog.text


def test_a_teacher_url_must_be_a_url(make_proxy, policy_server):
    with pytest.raises(ValueError, match="openclaw_opd_teacher_url"):
        make_proxy(policy_server.url, "", mode="opd", opd_teacher_url="teacher:30020")
