"""Moved to pipeline.steps.quantize.sensitivity. This alias keeps `pipeline.steps.sensitivity` importing the same
module object for files not yet updated (tests/unit/test_fallback_search.py); delete it once they are."""

import sys

from pipeline.steps.quantize import sensitivity

sys.modules[__name__] = sensitivity
