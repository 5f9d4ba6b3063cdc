"""`bench.request_limit`: its page is the events route's, and its server answers every request sent."""

from __future__ import annotations

from bench.request_limit import measure, poll_page
from shared.requests import EventsPage


def test_the_page_is_a_long_poll_page_of_one_delta() -> None:
    page = EventsPage.model_validate_json(poll_page())
    assert [event["type"] for event in page.events] == ["delta"]
    assert (page.cursor, page.done) == ("1234-1", False)


def test_every_request_sent_is_answered_and_the_servers_cpu_is_counted_a_request() -> None:
    cost = measure(connections=10, requests_per_second=200, seconds=3)
    assert cost.sent == cost.answered == 3 * 200  # the rate's worth of the seconds, however late they ran
    assert cost.requests == 200  # the window, counted by the server: 3 s less a settling second at each end
    assert cost.cpu_us_per_request > 0  # the server's clock is read to the ns, not in 10 ms ticks
