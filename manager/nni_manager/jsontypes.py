"""JSON as the manager reads and writes it: the one alias for decoded JSON (issue 34).

`JSONValue` is what `json.loads` can return; code that reads into it narrows with `isinstance`
(or declares the shape with a TypedDict where one is known). Values only passed on to
`json.dumps` are typed `object`, inputs only read `Mapping[str, object]`: a `dict[str, int]` is
not a `JSONObject` (dict is invariant), so `JSONObject` is for what we decode, not what we accept.
"""
from __future__ import annotations

from typing import Dict, List, TypeAlias, Union

JSONScalar: TypeAlias = Union[str, int, float, bool, None]
JSONValue: TypeAlias = Union[JSONScalar, List["JSONValue"], Dict[str, "JSONValue"]]
JSONObject: TypeAlias = Dict[str, JSONValue]
