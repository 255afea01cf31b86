"""A message's encoding (persist.format): decoding, and reading where it goes without decoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import (
    DecodeError,
    decode_message,
    encode_message,
    peek_message,
)
from tests.core.helpers import message_fields as fields
from tests.core.test_pending import MESSAGES, ROUND_TRIP


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_a_message_round_trips_and_peeking_reads_its_filing_fields(message: Message) -> None:
    message.location, message.marks = 0, None  # (kept beside the encoding, not in it)
    data = encode_message(message)
    assert fields(decode_message(data)) == fields(message)
    peeked = peek_message(data)
    assert (peeked.destination, peeked.seq, peeked.priority, peeked.size) == (
        message.destination,
        message.seq,
        message.priority,
        len(message.body),
    )
    assert peeked.delivery_count == message.delivery_count
    assert fields(peeked.decode()) == fields(message)
    assert peeked.encoded() is data  # the count it holds: no copy


@settings(max_examples=100, deadline=None)
@given(MESSAGES, st.integers(0, 2**32 - 1))
def test_an_encoded_message_takes_the_delivery_count_recovery_found(
    message: Message, count: int
) -> None:
    peeked = peek_message(encode_message(message))
    peeked.delivery_count = count
    message.delivery_count = count
    assert peeked.encoded() == encode_message(message)


@pytest.mark.parametrize("message", ROUND_TRIP)
def test_a_message_cut_short_or_too_long_is_refused(message: Message) -> None:
    data = encode_message(message)
    for size in range(len(data)):
        with pytest.raises(DecodeError):
            decode_message(data[:size])
    with pytest.raises(DecodeError, match="do not add up"):
        peek_message(data + b"\0")


def test_an_unknown_destination_kind_is_refused() -> None:
    data = bytearray(encode_message(ROUND_TRIP[0]))
    data[0] = 7
    with pytest.raises(DecodeError, match="unknown destination kind 7"):
        decode_message(bytes(data))
