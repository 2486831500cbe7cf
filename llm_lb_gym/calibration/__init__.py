"""Simulator calibration: the latency presets fitted to Vidur's GPU profiles and to the paper's
V100 figures, and the roofline efficiency factors behind the hardware catalog.

``vidur_profiles`` rebuilds vLLM step times from Vidur's per-operator profiles; ``calibrate``
fits the presets' iteration-time coefficients to them (``paper_v100`` the V100 preset to the
paper's three figures); ``calibrate_hardware`` fits the roofline factors of ``sim/roofline.py``.
The library holds the constants these print (``sim/latency.py``, ``sim/roofline.py``); the
commands are ``python -m llm_lb_gym.experiments.calibrate``, ``calibrate_hardware`` and ``paper_v100``
(docs/calibration.md, docs/hardware.md). Nothing here runs when the simulator does: it needs the
profiles (``python -m llm_lb_gym.data``) and SciPy.
"""
