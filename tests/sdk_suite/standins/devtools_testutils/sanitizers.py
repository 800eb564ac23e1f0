"""Sanitizers rewrite recordings; live, there are none: each does nothing."""

from __future__ import annotations

from typing import Any


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


add_body_key_sanitizer = _nothing
add_body_regex_sanitizer = _nothing
add_general_regex_sanitizer = _nothing
add_general_string_sanitizer = _nothing
add_header_regex_sanitizer = _nothing
add_oauth_response_sanitizer = _nothing
add_remove_header_sanitizer = _nothing
add_uri_regex_sanitizer = _nothing
remove_batch_sanitizers = _nothing
set_custom_default_matcher = _nothing
