"""TextStream: incremental UTF-8 detokenization with stop strings held back until they cannot match."""

from __future__ import annotations

from collections.abc import Sequence

from backend.server.text_stream import TextStream


def byte_ids(text: str) -> list[int]:
    return list(text.encode())


def identity(ids: Sequence[int]) -> bytes:
    return bytes(ids)


def test_a_character_split_across_tokens_is_sent_whole() -> None:
    stream = TextStream(identity)
    euro = byte_ids("€")
    assert stream.push(euro[:2]).text == ""
    assert stream.push(euro[2:]).text == "€"


def test_stop_string_across_tokens_truncates_before_it() -> None:
    stream = TextStream(identity, stop=["END"])
    sent = [stream.push(byte_ids(piece)) for piece in ["abc E", "N", "D tail"]]
    assert [d.text for d in sent] == ["abc ", "", ""]
    assert sent[-1].stopped
    assert stream.text == "abc "


def test_held_back_prefix_is_released_when_it_stops_matching() -> None:
    stream = TextStream(identity, stop=["END"])
    assert stream.push(byte_ids("xE")).text == "x"
    assert stream.push(byte_ids("Nd")).text == "ENd"
    assert stream.finish().text == ""


def test_finish_flushes_a_held_back_prefix() -> None:
    stream = TextStream(identity, stop=["stop here"])
    assert stream.push(byte_ids("go st")).text == "go "
    delta = stream.finish()
    assert delta.text == "st" and not delta.stopped


def test_earliest_of_several_stop_strings_wins() -> None:
    stream = TextStream(identity, stop=["cd", "b"])
    delta = stream.push(byte_ids("abcd"))
    assert delta.text == "a" and delta.stopped
