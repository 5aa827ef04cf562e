"""A chat bot: runs ask their questions in the chat, and the chat's replies answer them.

    python examples/queue_bot.py [--decline]

The chat is two queues (anyio memory streams): what the bot posts, and what people reply.
A stand-in person reads each post and replies "yes" (or "no" with ``--decline``). In a
real bot, the queues are your chat library's send and receive.
"""

from __future__ import annotations

import argparse

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from _refund import model, refund
from toolnexus_async import Answer, Inbox, LlmClient, Toolkit

Post = tuple[str, str]  # (request id, text)
Reply = tuple[str, str]  # (request id, what the person wrote)


async def forward(inbox: Inbox, posts: MemoryObjectSendStream[Post]) -> None:
    # Every request that parks is posted once, as it arrives.
    async for request in inbox.requests():
        await posts.send((request.id, f"{request.prompt} (yes/no)"))


async def answer_from(inbox: Inbox, replies: MemoryObjectReceiveStream[Reply]) -> None:
    async for request_id, text in replies:
        await inbox.answer(Answer(request_id, ok=text.strip().lower() == "yes"))


async def person(
    posts: MemoryObjectReceiveStream[Post], replies: MemoryObjectSendStream[Reply], say: str
) -> None:
    async for request_id, text in posts:
        print(f"bot: {text}\nperson: {say}", flush=True)
        await replies.send((request_id, say))


async def chat(orders: list[str], say: str) -> None:
    inbox = Inbox()
    posts_in, posts_out = anyio.create_memory_object_stream[Post](100)
    replies_in, replies_out = anyio.create_memory_object_stream[Reply](100)

    async def one(order: str, client: LlmClient, toolkit: Toolkit) -> None:
        result = await client.run(f"refund order {order}", toolkit)
        print(f"run {order}: {result.status}: {result.text}", flush=True)

    async with (
        Toolkit.create(builtins=False, extra_tools=[refund]) as toolkit,
        LlmClient.in_process(model, wait_for=inbox) as client,
        anyio.create_task_group() as chat_tasks,
    ):
        # The chat tasks live as long as the bot; the runs have a task group of their own,
        # so once every run has ended the chat is cancelled and no task is left behind.
        chat_tasks.start_soon(forward, inbox, posts_in)
        chat_tasks.start_soon(person, posts_out, replies_in, say)
        chat_tasks.start_soon(answer_from, inbox, replies_out)
        async with anyio.create_task_group() as runs:
            for order in orders:
                runs.start_soon(one, order, client, toolkit)
        chat_tasks.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="a chat bot that answers runs from a queue")
    parser.add_argument("--decline", action="store_true", help='the person replies "no"')
    say = "no" if parser.parse_args().decline else "yes"
    anyio.run(chat, ["A17", "B42"], say)


if __name__ == "__main__":
    main()
