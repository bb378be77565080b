"""procrastinate worker: async task, asyncio.sleep(s), then INSERT into mix_effect on its own
autocommit psycopg connection (procrastinate gives the task no transaction)."""

import asyncio
import sys

import psycopg
from procrastinate import App, PsycopgConnector

URL, SLOTS = sys.argv[1], int(sys.argv[2])
conns: asyncio.Queue | None = None
app = App(connector=PsycopgConnector(conninfo=URL))


@app.task(name="job")
async def job(k, s):
    await asyncio.sleep(s)
    c = await conns.get()
    try:
        await c.execute("INSERT INTO mix_effect(job_key) VALUES (%s)", (k,))
    finally:
        conns.put_nowait(c)


async def main():
    global conns
    conns = asyncio.Queue()
    for _ in range(SLOTS):
        conns.put_nowait(await psycopg.AsyncConnection.connect(URL, autocommit=True))
    print(f"app.run_worker_async(concurrency={SLOTS}, wait=True) other options default", flush=True)
    async with app.open_async():
        await app.run_worker_async(concurrency=SLOTS, wait=True)


asyncio.run(main())
