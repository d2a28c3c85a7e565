"""Delivery: a worker's reply events back to the client that waits for them.

`replies.py` (ReplyIntake) reads the events off Redis (pub/sub live, the replay log on a gap),
`router.py` finds each event's route (server id -> connection, client id) and drops what is
stale or already sent, and `events.py` holds the typed client events the routes carry (each door
renders them at its edge). What a delivery does at its client (output guards, send, settle) is
the request lifecycle's (`gateway/admission/lifecycle.py`, `RequestLifecycle.deliver`).
"""
