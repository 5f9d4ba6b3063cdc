"""An agent of the OpenAI Agents SDK, for the tests that run one through streampool's APIs."""

from __future__ import annotations

from agents import Agent, Model, function_tool, set_tracing_disabled


def weather_agent(model: Model) -> tuple[Agent[None], list[str]]:
    """An OpenAI Agents SDK agent with a `get_weather` function tool on `model`, and the cities its tool
    was called for."""
    set_tracing_disabled(True)  # nothing is sent to OpenAI's trace collector
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny"

    agent = Agent[None](
        name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model
    )
    return agent, cities
