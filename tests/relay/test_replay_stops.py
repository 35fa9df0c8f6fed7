"""The replay-stop registry: durable, refused when it cannot be read (never silently empty), bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from relayproxy.relay import replay_stops as R


def test_a_stop_survives_a_reload_and_clearing_it_too(tmp_path):
    stops = R.ReplayStops.load(tmp_path)
    assert stops.persistent and not stops
    assert stops.set(R.ReplayStop(7, "master-bin.000003", 1234, "0-1-500", "before 0-1-501")) is None
    again = R.ReplayStops.load(tmp_path)
    assert again.get(7) == stops.get(7) and again.get(8) is None
    assert again.clear(7).position == 1234 and again.clear(7) is None
    assert R.ReplayStops.load(tmp_path).get(7) is None
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("raw", [b"", b"{", b'{"format": "x", "version": 1, "stops": []}', b"\xff\xfe",
                                 b'{"format": "relayproxy-replay-stops", "version": 1, "stops": [{"server_id": 0, '
                                 b'"file": "a", "position": 4}]}',
                                 b'{"format": "relayproxy-replay-stops", "version": 1, "stops": [{"file": "a"}]}'])
def test_a_registry_that_cannot_be_read_is_an_error_naming_it(tmp_path, raw):
    (tmp_path / R.REPLAY_STOPS_NAME).write_bytes(raw)
    with pytest.raises(R.ReplayStopsError, match="replay-stops"):
        R.ReplayStops.load(tmp_path)


def test_in_memory_stops_for_a_read_only_directory():
    stops = R.ReplayStops.load(None)
    stops.set(R.ReplayStop(1, "f.000001", 4))
    assert not stops.persistent and stops.get(1).file == "f.000001"


def test_the_number_of_stops_is_bounded(monkeypatch):
    monkeypatch.setattr(R, "MAX_STOPS", 3)
    stops = R.ReplayStops(None)
    for sid in (1, 2, 3):
        stops.set(R.ReplayStop(sid, "f.000001", 4))
    stops.set(R.ReplayStop(3, "f.000001", 8))  # replacing one is always allowed
    with pytest.raises(R.ReplayStopsError, match="at most 3"):
        stops.set(R.ReplayStop(4, "f.000001", 4))


@pytest.mark.parametrize("stop", [R.ReplayStop(1, "", 4), R.ReplayStop(1, "relayproxy.index", 4),
                                  R.ReplayStop(1, "a/b", 4), R.ReplayStop(1, "f.1", 3), R.ReplayStop(1 << 32, "f", 4),
                                  R.ReplayStop(1, "f", 4, label="x" * 600)])
def test_invalid_stops_are_refused(stop):
    with pytest.raises(R.ReplayStopsError):
        R.ReplayStops(None).set(stop)


def test_caps_by_file_order():
    stop = R.ReplayStop(1, "b.000002", 500)
    names = ["b.000001", "b.000002", "b.000003"]
    assert stop.caps("b.000001", names) is None
    assert stop.caps("b.000002", names) == 500
    assert stop.caps("b.000003", names) == 4
    assert stop.caps("b.000000", names) is None  # purged meanwhile: not past the stop's file


@given(st.dictionaries(st.integers(1, (1 << 32) - 1),
                       st.tuples(st.from_regex(r"[a-z]{1,8}\.[0-9]{6}", fullmatch=True), st.integers(4, 1 << 40),
                                 st.text(max_size=40)), max_size=20))
def test_encode_decode_round_trip(entries):
    stops = {sid: R.ReplayStop(sid, f, p, label=label) for sid, (f, p, label) in entries.items()}
    assert R.decode(R.encode(stops)) == stops
