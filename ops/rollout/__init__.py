"""The rollout policy: which model versions exist and which one serves whom. The registry of
versions and routes, the canary that judges a new version against its objectives and promotes or
rolls it back, the outcomes each request records for that judgement, the objectives' grammar, and
the model store on this machine. The gateway and the reaper run it; it stands on ops.core alone
(and the engine's model files, for the store), tests/test_floors.py.
"""
