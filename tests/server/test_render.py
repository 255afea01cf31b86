"""The frames the broker writes, against the general encoder they must agree with."""

from __future__ import annotations

import pytest

from sluiceway.errors import LocalProtocolError
from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.server.render import receipt_frame


@pytest.mark.parametrize("version", [None, *StompVersion])
@pytest.mark.parametrize("receipt", ["7", "a:b", "back\\slash", "line\nfeed", "é"])
def test_a_receipt_is_encoded_as_the_general_encoder_would(
    version: StompVersion | None, receipt: str
) -> None:
    frame = Frame("RECEIPT", {"receipt-id": receipt})
    try:
        expected = encode_frame(frame, version)
    except LocalProtocolError:
        with pytest.raises(LocalProtocolError):
            receipt_frame(receipt, version)
        return
    assert receipt_frame(receipt, version) == expected


def test_a_receipt_id_with_no_utf_8_form_is_refused_by_name() -> None:
    with pytest.raises(LocalProtocolError, match="receipt-id"):
        receipt_frame("\udc80", StompVersion.V1_2)
