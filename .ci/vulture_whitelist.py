"""Names vulture cannot see used (read by `vulture` in .ci/run): each is called by a
framework, not by stepsim's own code."""

from simulator.results.plots import SlideFigure

SlideFigure._ipython_display_  # IPython's display hook: a notebook cell shows the figures
_.monitor_interval  # tqdm's class attribute: 0 turns its monitor thread off (engine/loop.py)
_._value  # simpy's Event field, set by engine/loop.py timeout_at (tests/test_simpy_internals.py)
_.model_config  # pydantic's model configuration (scenario/schema.py)
__getattr__  # simulator/__init__.py: PEP 562 module hooks (the lazy public names)
__dir__
pytestmark  # pytest reads a test module's marks from it
_.handle_starttag  # html.parser.HTMLParser's hook (tests/test_html_report.py)
_.binary_location  # selenium's Chrome option (tests/test_html_report.py)
_.unheard_of  # tests/test_export.py sets it to show Result refuses new attributes
