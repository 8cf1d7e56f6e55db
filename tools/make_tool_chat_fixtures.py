#!/usr/bin/env python3
"""Tool-calling renderings of the Qwen chat templates, for tests/text/test_chat_template.cpp.

Renders tests/data/tokenizer/templates/{qwen3,qwen3_6}.jinja with jinja2 configured exactly as
transformers configures it (make_tokenizer_fixtures.make_jinja_renderer: sandboxed environment,
trim_blocks, lstrip_blocks, loopcontrols, its tojson filter) for conversations with `tools`,
assistant `tool_calls` and `tool` results, and writes tests/data/tokenizer/tool_chat_cases.json.
transformers itself is not used (the dev box has only jinja2), so the fixture says
"transformers_cross_checked": false.

Tool-call arguments: the OpenAI API sends them as a JSON string. Qwen3's template renders a string
as is; Qwen3.6's iterates `arguments|items`, which needs a mapping, so its cases pass the parsed
object (strata parses the string the same way). Each case records the arguments' JSON text.

    python3 tools/make_tool_chat_fixtures.py
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import DATA, make_jinja_renderer  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C)",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "days": {"type": "integer", "minimum": 1},
        "detail": {"type": "boolean"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns the top results.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"},
        "limit": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}}}}}

CALL_WEATHER = {"city": "Paris", "days": 2, "detail": True}
CALL_SEARCH = {"query": "strata \"MoE\" — inference\n2026", "filters": {"lang": "en", "safe": None},
               "limit": 2.5, "tags": ["a", "b"]}


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def conversations():
    return [
        ("query", [WEATHER], [{"role": "user", "content": "Weather in Paris?"}]),
        ("system_query", [WEATHER, SEARCH], [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris, and search for strata?"}]),
        ("round_trip", [WEATHER, SEARCH], [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": "Weather in Paris, and search for strata?"},
            {"role": "assistant", "content": "",
             "tool_calls": [call("get_weather", CALL_WEATHER, "call_1"),
                            call("search", CALL_SEARCH, "call_2")]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "no results"}]),
        ("content_then_call", [WEATHER], [
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "Let me check.",
             "tool_calls": [call("get_weather", {"city": "Paris"}, "call_9")]},
            {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "Thanks"}]),
        ("empty_arguments", [SEARCH], [
            {"role": "user", "content": "Anything"},
            {"role": "assistant", "content": None, "tool_calls": [call("search", {}, "call_0")]},
            {"role": "tool", "tool_call_id": "call_0", "content": "[]"}]),
    ]


def for_template(messages, template):
    """The messages as the template needs them: Qwen3.6 iterates the arguments object."""
    out = copy.deepcopy(messages)
    if template == "qwen3_6":
        for m in out:
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    render = make_jinja_renderer()
    templates = {}
    for name in ("qwen3", "qwen3_6"):
        with open(os.path.join(DATA, "templates", f"{name}.jinja"), encoding="utf-8") as f:
            templates[name] = f.read()
    cases = []
    convs = {}
    for cname, tools, messages in conversations():
        convs[cname] = {"tools": tools, "messages": messages}
        for tname, ttext in templates.items():
            for thinking in (True, False):
                opts = {"add_generation_prompt": True, "enable_thinking": thinking}
                expected = render(ttext, for_template(messages, tname), dict(opts, tools=tools))
                cases.append({"template": tname, "conversation": cname, "options": opts,
                              "expected": expected})
    out = {"conversations": convs, "cases": cases, "transformers_cross_checked": False}
    with open(os.path.join(DATA, "tool_chat_cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"tool chat cases: {len(cases)}")


if __name__ == "__main__":
    main()
