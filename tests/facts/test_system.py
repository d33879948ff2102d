"""The system probes: the rendezvous port seen by a real listener, and a free port to move to."""


def test_the_port_probe_sees_a_real_listener(tmp_path):
    import socket

    from sftdoctor.facts import Facts, Inputs

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        config = tmp_path / "run.toml"
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
        config.write_text(f'[model]\npath = "m"\n[data]\ntrain = "d.jsonl"\n[launch]\nmaster_port = {port}\n')
        assert Facts(Inputs(config=config)).get("rendezvous")["in_use"] is True
    assert Facts(Inputs(config=config)).get("rendezvous")["in_use"] is False
