"""The address a proxy advertises: under Slime it runs on whichever node Ray placed the RolloutManager."""

from __future__ import annotations

from openclaw_rl.address import advertised_host, advertised_url, write_address


def test_a_concrete_bind_is_advertised_as_it_is_and_an_explicit_host_wins():
    assert advertised_host("10.1.2.3") == "10.1.2.3"
    assert advertised_host("0.0.0.0", "head.example") == "head.example"
    assert advertised_url("::1", 30000) == "http://[::1]:30000"


def test_a_wildcard_bind_advertises_the_address_that_reaches_the_head_node():
    # toward a head on this machine the kernel's source address is loopback; never the wildcard itself
    assert advertised_host("0.0.0.0", env={"MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert advertised_host("0.0.0.0", env={}) not in ("0.0.0.0", "")


def test_the_address_file_holds_the_client_base_url(tmp_path):
    path = write_address(str(tmp_path), "http://10.0.0.7:30000")
    assert path == tmp_path / "proxy_address" and path.read_text() == "http://10.0.0.7:30000/v1\n"
    assert write_address("", "http://x:1") is None
    assert write_address(str(tmp_path / "missing" / "dir"), "http://x:1") is None  # logged, not raised


def test_the_proxy_beside_a_trainer_writes_where_it_can_be_reached(tmp_path, tiny_model_dir, tokenizer, policy_server):
    from openclaw_rl.config import load_settings
    from openclaw_rl.runtime import ProxyRuntime

    settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_server.url,
                              "spool_dir": str(tmp_path / "spool"), "proxy_port": 0,
                              "proxy_advertise_host": "node-3.cluster"}, env={})
    runtime = ProxyRuntime(settings, tokenizer=tokenizer)
    try:
        written = (tmp_path / "spool" / "proxy_address").read_text()
        assert written == f"http://node-3.cluster:{runtime.server.port}/v1\n"
    finally:
        runtime.stop()
