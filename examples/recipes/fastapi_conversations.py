"""Recipe: FastAPI with the provider in the lifespan and a lease per conversation.

One provider per server process, opened when the app starts and closed when it stops
(the lifespan). Each message to a conversation is answered under that conversation's
lease, so two replicas (or two workers of one) never answer the same conversation at
once: the second gets ``409`` naming the holder to route to, or, with ``?wait=S``,
queues up to ``S`` seconds for its turn. Serve it from this directory::

    LEASEKIT_URL=redis://localhost:6379/0 uvicorn fastapi_conversations:app --workers 2

and post a message::

    curl -X POST localhost:8000/conversations/c42/messages \\
        -H 'content-type: application/json' -d '{"text": "hello"}'
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import leasekit

LEASES_URL = os.environ.get("LEASEKIT_URL", "sqlite:///leasekit.db")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Opened once per worker process; closing releases nothing by itself, so every
    # lease below is taken in an ``async with`` that releases it.
    async with leasekit.connect(LEASES_URL) as leases:
        app.state.leases = leases
        yield


app = FastAPI(lifespan=lifespan)


class Message(BaseModel):
    text: str


@app.post("/conversations/{conversation_id}/messages")
async def post_message(
    conversation_id: str, message: Message, request: Request, wait: float = 0.0
) -> dict[str, object]:
    """Answer ``message`` under the conversation's lease; 409 while another turn holds it."""
    leases: leasekit.LeaseProvider = request.app.state.leases
    key = f"conversation:{conversation_id}"
    owner = leasekit.new_owner_id("turn")  # unique per request: see docs/hold.md
    try:
        async with leasekit.hold(leases, key, owner, ttl_ms=30_000, wait_s=wait) as lease:
            reply = await answer(message.text)
            # What the store says while this turn runs (the recipe's test reads it).
            holder = await leases.get_lease_owner(key)
            return {"reply": reply, "owner": owner, "holder": holder, "token": lease.token}
    except leasekit.LeaseHeld as busy:
        raise HTTPException(409, {"error": "conversation busy", "holder": busy.holder}) from None
    except leasekit.InvalidLeaseArgument as bad:
        raise HTTPException(400, {"error": str(bad)}) from None


async def answer(text: str) -> str:
    """The stand-in for the real work (a model call, a tool run)."""
    await asyncio.sleep(0)
    return text[::-1]
