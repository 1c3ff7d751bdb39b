"""The experiment's process helpers: free ports outside the kernel's ephemeral range, and a command
stopped by Ctrl-C or SIGTERM once."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest

from fedsched.experiment import processes
from fedsched.experiment.processes import HOST, ephemeral_range, free_port, stopped_by_signals


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    lo, hi = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        assert processes.FREE_PORT_FLOOR <= port <= 65535
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket() as s:
            s.bind((HOST, port))


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the candidates cut to two ports, one of them taken, the free one is the answer; handed
    out once, it is never handed out again (the kernel's choice then, neither of the two)."""
    monkeypatch.setattr(processes, "_handed_out", set())
    with socket.socket() as taken, socket.socket() as s:
        taken.bind((HOST, 0))
        taken.listen()
        s.bind((HOST, 0))
        busy, free = taken.getsockname()[1], s.getsockname()[1]
    with socket.socket() as taken:
        taken.bind((HOST, busy))
        taken.listen()
        monkeypatch.setattr(processes, "_candidates",
                            lambda: [p for p in (busy, free) if p not in processes._handed_out])
        for seed in range(5):
            monkeypatch.setattr(processes, "_handed_out", set())
            assert free_port(random.Random(seed)) == free
        assert free_port(random.Random(0)) not in (free, busy)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("32768\t60999\n", (32768, 60999)), ("1024 65535", (1024, 65535)), ("junk", (32768, 60999)),
     ("", (32768, 60999))],
)
def test_ephemeral_range_read_or_linux_default(tmp_path: Path, text: str, expected: tuple[int, int]) -> None:
    f = tmp_path / "range"
    f.write_text(text)
    assert ephemeral_range(f) == expected
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_a_signal_stops_the_block_once_and_later_ones_are_ignored() -> None:
    """SIGTERM inside ``stopped_by_signals`` raises KeyboardInterrupt once, after ``on_stop``;
    a later Ctrl-C or SIGTERM (a second one while stopping) is ignored; without a signal the
    handlers are put back as they were."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with stopped_by_signals():
            pass
        assert {sig: signal.getsignal(sig) for sig in before} == before
        said: list[str] = []
        with pytest.raises(KeyboardInterrupt, match="signal 15"), \
                stopped_by_signals(lambda: said.append("stopping")):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        assert said == ["stopping"]
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing raised
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
