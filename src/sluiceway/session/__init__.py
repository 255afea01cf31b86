"""The sans-IO STOMP session: frames in, frames out, no sockets and no awaiting."""
