# The Python clients of the verified list (docs/src/clients.md) through `mcp-context serve`, as tests/all/clients.rs
# runs them: openai, openai-agents, langchain-openai, litellm, pydantic-ai, llama-index-llms-openai and anthropic,
# each as alice and bob, plain and streamed, with one tool. Every prompt carries `[client user mode]` so that the
# test can tell the upstream's requests apart. Argument: the proxy's URL, without /v1. Prints one JSON object.
import asyncio
import json
import sys

PROXY = sys.argv[1]
BASE = PROXY + "/v1"  # OpenAI-style clients; the Anthropic SDK takes PROXY
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def prompt(client, user, mode):
    return f"[{client} {user} {mode}] What is new?"


async def openai_client(user, key):
    from openai import OpenAI

    client = OpenAI(base_url=BASE, api_key=key, max_retries=0)

    def ask(mode, **kw):
        messages = [{"role": "user", "content": prompt("openai", user, mode)}]
        return client.chat.completions.create(model="gpt-4o", messages=messages, tools=[TOOL], **kw)

    plain = ask("plain").choices[0].message.content
    stream = "".join(c.choices[0].delta.content or "" for c in ask("stream", stream=True) if c.choices)
    return {"plain": plain, "stream": stream}


async def anthropic_client(user, key):
    import anthropic

    client = anthropic.Anthropic(base_url=PROXY, api_key=key, max_retries=0)
    tool = {"name": "get_weather", "description": "The weather in a city", "input_schema": TOOL["function"]["parameters"]}

    def ask(mode):
        messages = [{"role": "user", "content": prompt("anthropic", user, mode)}]
        return {"model": "claude-sonnet-4-5", "max_tokens": 64, "tools": [tool], "messages": messages}

    plain = client.messages.create(**ask("plain")).content[0].text
    with client.messages.stream(**ask("stream")) as s:
        stream = "".join(s.text_stream)
    return {"plain": plain, "stream": stream}


async def openai_agents(user, key):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="gpt-4o", openai_client=AsyncOpenAI(base_url=BASE, api_key=key))
    agent = Agent(name="notes", instructions="Answer briefly.", model=model, tools=[function_tool(get_weather)])
    plain = await Runner.run(agent, prompt("openai-agents", user, "plain"))
    streamed = Runner.run_streamed(agent, prompt("openai-agents", user, "stream"))
    async for _ in streamed.stream_events():
        pass
    return {"plain": plain.final_output, "stream": streamed.final_output}


async def langchain_openai(user, key):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="gpt-4o", base_url=BASE, api_key=key, max_retries=0).bind_tools([TOOL])
    plain = llm.invoke(prompt("langchain-openai", user, "plain")).content
    stream = "".join(c.content for c in llm.stream(prompt("langchain-openai", user, "stream")))
    return {"plain": plain, "stream": stream}


async def litellm_client(user, key):
    import litellm

    def ask(mode, **kw):
        messages = [{"role": "user", "content": prompt("litellm", user, mode)}]
        return litellm.completion(model="openai/gpt-4o", api_base=BASE, api_key=key, messages=messages, tools=[TOOL], **kw)

    plain = ask("plain").choices[0].message.content
    stream = "".join(c.choices[0].delta.content or "" for c in ask("stream", stream=True) if c.choices)
    return {"plain": plain, "stream": stream}


async def pydantic_ai(user, key):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=BASE, api_key=key))
    agent = Agent(model, tools=[get_weather])
    plain = (await agent.run(prompt("pydantic-ai", user, "plain"))).output
    async with agent.run_stream(prompt("pydantic-ai", user, "stream")) as s:
        stream = "".join([d async for d in s.stream_text(delta=True)])
    return {"plain": plain, "stream": stream}


async def llama_index(user, key):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(model="gpt-4o", api_base=BASE, api_key=key, max_retries=0)
    ask = lambda mode: [ChatMessage(role="user", content=prompt("llama-index", user, mode))]  # noqa: E731
    plain = llm.chat(ask("plain"), tools=[TOOL]).message.content
    stream = "".join(r.delta or "" for r in llm.stream_chat(ask("stream"), tools=[TOOL]))
    return {"plain": plain, "stream": stream}


CLIENTS = {
    "openai": openai_client,
    "openai-agents": openai_agents,
    "langchain-openai": langchain_openai,
    "litellm": litellm_client,
    "pydantic-ai": pydantic_ai,
    "llama-index": llama_index,
    "anthropic": anthropic_client,
}


async def main():
    out = {}
    for name, run in CLIENTS.items():
        for user in ["alice", "bob"]:
            try:
                out.setdefault(name, {})[user] = await run(user, f"key-{user}")
            except Exception as e:  # reported per client, so that one failure does not hide the others
                out.setdefault(name, {})[user] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))


asyncio.run(main())
