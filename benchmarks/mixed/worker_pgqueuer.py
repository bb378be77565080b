"""pgqueuer worker: async handler, asyncio.sleep(s), then INSERT into mix_effect on its own
autocommit psycopg connection (pgqueuer gives the handler no transaction)."""

import asyncio
import json
import sys

import asyncpg
import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver

URL, SLOTS, MODE = sys.argv[1], int(sys.argv[2]), sys.argv[3]


async def main():
    conns: asyncio.Queue = asyncio.Queue()
    for _ in range(SLOTS):
        conns.put_nowait(await psycopg.AsyncConnection.connect(URL, autocommit=True))
    conn = await asyncpg.connect(URL)
    pgq = PgQueuer(AsyncpgDriver(conn))
    ep_limit = SLOTS if MODE == "eplimit" else 0

    @pgq.entrypoint("job", concurrency_limit=ep_limit)
    async def job(j) -> None:
        p = json.loads(j.payload)
        await asyncio.sleep(p["s"])
        c = await conns.get()
        try:
            await c.execute("INSERT INTO mix_effect(job_key) VALUES (%s)", (p["k"],))
        finally:
            conns.put_nowait(c)

    if (
        MODE == "eplimit"
    ):  # library defaults (batch_size=10, no max_concurrent_tasks) + entrypoint limit
        print(f"pgq.run() defaults; @entrypoint('job', concurrency_limit={SLOTS})", flush=True)
        await pgq.run()
    else:  # hard per-worker cap: needs max_concurrent_tasks >= 2*batch_size
        print(f"pgq.run(batch_size={SLOTS // 2}, max_concurrent_tasks={SLOTS})", flush=True)
        await pgq.run(batch_size=SLOTS // 2, max_concurrent_tasks=SLOTS)


asyncio.run(main())
