"""A STOMP session driven without sockets, and a decoder for what it writes."""

from __future__ import annotations

from sluiceway.core.broker import Broker
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame
from sluiceway.session.session import StompSession


class Peer:
    """A session and a decoder for what it writes."""

    def __init__(self, broker: Broker, version: str = "1.2", **connect: str) -> None:
        """Connected with `version` (and the CONNECT headers `connect`, _ for -) unless it
        is empty."""
        self.ready = 0
        self.session = StompSession(broker, on_ready=self._ready, peer="test")
        self.decoder = FrameDecoder()
        if version:
            extra = {name.replace("_", "-"): value for name, value in connect.items()}
            self.feed("CONNECT", {"accept-version": version, "heart-beat": "0,0", **extra})
            (connected,) = self.control()
            assert connected.command == "CONNECTED"
            self.decoder.version = self.session.version

    def _ready(self) -> None:
        self.ready += 1

    def feed(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        frame = Frame(command, dict(headers or {}), body)
        self.session.receive_data(encode_frame(frame, self.session.version))

    def control(self) -> list[Frame]:
        return self._decode(self.session.data_to_send())

    def payload(self, limit: int = 1000) -> list[Frame]:
        data, count = self.session.take_payload(limit)
        frames = self._decode(data)
        assert len(frames) == count
        return frames

    def _decode(self, data: bytes) -> list[Frame]:
        self.decoder.receive_data(data)
        frames = []
        while (event := self.decoder.next_event()) is not None:
            assert isinstance(event, Frame)
            frames.append(event)
        return frames
