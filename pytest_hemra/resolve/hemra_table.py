"""`[hemra]` in task.toml: what HEMRA adds to Harbor's task format (Harbor ignores it): the SWE
and open-ended tracks' settings, the open-ended rubric's criteria, and a task's exemptions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Criterion(BaseModel):
    """One line of an open-ended task's rubric, scored 0-5 by the judge."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,39}$")
    weight: float = Field(default=1.0, gt=0)
    description: str


class HemraTask(BaseModel):
    """`[hemra]` in task.toml: what HEMRA adds to the Harbor format (Harbor ignores it).

    `track = "swe"`: no reward file; after the agent HEMRA applies `test_patch` (hidden tests,
    a unified diff relative to the task folder) in /app and runs `test_command` (argv), scoring
    passed / total tests. See docs/tracks.md."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    track: Literal["reward", "swe", "open"] = "reward"
    test_patch: str | None = None
    test_command: list[str] | None = None
    test_timeout_sec: float = Field(default=300.0, gt=0)
    # the open-ended track (docs/tracks.md)
    expected_files: list[str] = Field(default_factory=list)
    criteria: list[Criterion] = Field(default_factory=list)
    pass_threshold: float = Field(default=0.7, ge=0, le=1)
    judge_model: str | None = None
    # the agent may change the system's programs and libraries (a task about them): its
    # trials are not marked `tampered` for it (docs/datasets.md, docs/security.md)
    agent_may_change_system: bool = False
    # the agent's processes left running for the verifier (a worker or server its tests check):
    # the room is not emptied after the turn (docs/security.md); the run file may say otherwise
    keep_agent_processes: bool = False
    # the reward.json key that is the headline where the verifier writes no `reward` key; a
    # run file's `[report] reward_key` wins over it (core/reward.py, docs/reports.md)
    reward_key: str | None = Field(default=None, min_length=1, max_length=200)
