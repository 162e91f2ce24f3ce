import pytest

pytestmark = pytest.mark.integration
