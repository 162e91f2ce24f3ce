"""Class-parallel jobs (docs/class-parallel.md): the job file's ``[class_parallel]`` section and the
signed records of the job's life.

- ``ClassParPlan`` (coordinator-signed, under ``classpar``): which peer trains the teacher, then the
  class groups and which peer serves each coded worker (index w < G: group w's sub-network, which it
  builds; w >= G: a parity row over its support, whose sub-networks it fetches from their builders).
- ``ClassParTeacher`` (signed by the teacher's peer, subkey = its peer id): the teacher's SHA-256 and
  its mean penultimate features per class, from which the coordinator groups the classes.
- ``ClassParSubnet`` (signed by a worker's peer, subkey = its peer id): the worker(s) it holds loaded
  and serves, with each unit's SHA-256; the coordinator marks the plan "serving" once every worker of
  the plan is held.

Every list and number is bounded, and cross-field rules (groups partition the classes, one peer per
coded worker, hashes are hex SHA-256) are checked before any code reads a record.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from potluck.protocol.records import Name, NonNegFloat, PeerId, Record

MAX_CLASSES = 1000
MAX_GROUPS = 64
MAX_PARITY = 16
MAX_FEATURES = 1024  # width of the teacher's penultimate layer a record may carry
NUM_GENERATED_CLASSES = 10  # classes of the procedural data set (potluck.classpar.data)

Sha256 = Annotated[str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Groups = Annotated[
    list[
        Annotated[
            list[Annotated[int, Field(ge=0, lt=MAX_CLASSES)]], Field(min_length=1, max_length=MAX_CLASSES)
        ]
    ],
    Field(max_length=MAX_GROUPS),
]
CodeKind = Literal["cauchy", "group"]


class ClassParSpec(BaseModel):
    """The ``[class_parallel]`` section of a job file: how the classes are split, built and served."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    groups: int = Field(default=2, ge=1, le=MAX_GROUPS)  # G sub-networks
    teacher: Literal["train"] = "train"  # one peer trains the teacher from the job's seed
    teacher_epochs: int = Field(default=8, ge=1, le=1000)
    widths: list[int] = Field(default=[12, 16, 24, 32], min_length=1, max_length=8)
    train_per_class: int = Field(default=300, ge=2, le=100_000)  # procedural images per class
    apoz_threshold: float = Field(default=0.73, gt=0.0, le=1.0)
    macs_budget: float | None = Field(default=None, gt=0.0, le=100.0)  # x the teacher's MACs / G
    oversample_k: float = Field(default=1.0, ge=0.0, le=100.0)
    retrain_epochs: int = Field(default=6, ge=1, le=1000)
    distill: float = Field(default=0.0, ge=0.0, le=1.0)
    parity: int = Field(default=0, ge=0, le=MAX_PARITY)  # r coded replies when serving
    code: CodeKind = "cauchy"  # "group": one parity per group of sub-networks
    # An image folder (data.source = "directory"): its class count (subdirectories, in sorted order),
    # and the SHA-256 of the owner's copy (``potluck launch`` fills it in): a peer whose copy differs
    # refuses to build rather than train on other data
    classes: int | None = Field(default=None, ge=2, le=MAX_CLASSES)
    data_sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ClassParSpec:
        if any(not 1 <= w <= 4096 for w in self.widths):
            raise ValueError("class_parallel.widths must each be in [1, 4096]")
        if self.code == "group" and self.parity > self.groups:
            raise ValueError(
                f"class_parallel.code = 'group' makes one parity per group of sub-networks: "
                f"parity ({self.parity}) must not exceed groups ({self.groups})"
            )
        return self

    def check_classes(self, num_classes: int) -> None:
        """``ValueError`` unless ``num_classes`` split into ``groups`` as the code needs."""
        if self.groups > num_classes:
            raise ValueError(f"class_parallel.groups ({self.groups}) exceeds the {num_classes} classes")
        if self.parity > 0 and num_classes % self.groups:
            raise ValueError(
                f"class_parallel.parity > 0 needs equal groups: the {num_classes} classes are not "
                f"divisible by groups ({self.groups})"
            )

    @property
    def num_classes(self) -> int:
        """K: the image folder's class count, else the procedural set's."""
        return self.classes if self.classes is not None else NUM_GENERATED_CLASSES

    @property
    def workers(self) -> int:
        """Coded workers when serving: one per group plus the parities."""
        return self.groups + self.parity


class ClassParPlan(Record):
    """Signed by the coordinator, under the ``classpar`` key (one value, no subkey)."""

    KIND: ClassVar[str] = "ClassParPlan"

    job: Name
    epoch: int = Field(ge=0, lt=2**31)  # grows whenever the assignment changes
    status: Literal["teacher", "building", "serving"]
    teacher: PeerId  # the peer that trains the teacher (and serves it to builders)
    teacher_sha256: Sha256 | None = None  # set once its ClassParTeacher record was seen
    num_classes: int = Field(ge=1, le=MAX_CLASSES)
    groups: Groups = Field(default_factory=list)  # empty while status == "teacher"
    parity: int = Field(default=0, ge=0, le=MAX_PARITY)
    code: CodeKind = "cauchy"
    workers: list[PeerId] = Field(default_factory=list, max_length=MAX_GROUPS + MAX_PARITY)
    issued_at: NonNegFloat

    @model_validator(mode="after")
    def _consistent(self) -> ClassParPlan:
        if self.status == "teacher":
            if self.groups or self.workers:
                raise ValueError("a teacher plan names no groups and no workers yet")
            return self
        if self.teacher_sha256 is None:
            raise ValueError(f"a {self.status} plan names the teacher's SHA-256")
        flat = sorted(c for g in self.groups for c in g)
        if flat != list(range(self.num_classes)):
            raise ValueError(f"groups must partition the classes 0..{self.num_classes - 1}")
        if self.parity and len({len(g) for g in self.groups}) != 1:
            raise ValueError("coded groups (parity > 0) must all be the same size")
        if len(self.workers) != len(self.groups) + self.parity:
            raise ValueError(
                f"{len(self.workers)} workers for {len(self.groups)} groups and {self.parity} parities"
            )
        if self.code == "group" and self.parity > len(self.groups):
            raise ValueError("a group code has at most one parity per group")
        return self

    @property
    def holders(self) -> frozenset[str]:
        return frozenset(self.workers)

    def workers_of(self, peer_id: str) -> list[int]:
        """The coded workers ``peer_id`` serves (index into ``workers``)."""
        return [w for w, p in enumerate(self.workers) if p == peer_id]


class ClassParTeacher(Record):
    """The teacher a peer trained: stored under ``classpar-teacher``, subkey = its peer id."""

    KIND: ClassVar[str] = "ClassParTeacher"

    peer_id: PeerId
    job: Name
    epoch: int = Field(ge=0, lt=2**31)  # of the plan that asked for it
    sha256: Sha256  # of the serialized teacher, as served over the classpar stream protocol
    size_bytes: int = Field(ge=1, le=64 << 20)
    features: list[Annotated[list[float], Field(min_length=1, max_length=MAX_FEATURES)]] = Field(
        min_length=1, max_length=MAX_CLASSES
    )
    val_accuracy: Fraction
    issued_at: NonNegFloat

    @model_validator(mode="after")
    def _rectangular(self) -> ClassParTeacher:
        if len({len(row) for row in self.features}) != 1:
            raise ValueError("features must have the same width for every class")
        return self


class HeldUnit(BaseModel):
    """One sub-network a worker's peer holds: its group index and the SHA-256 of its serialization."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: int = Field(ge=0, lt=MAX_GROUPS)
    sha256: Sha256
    macs: int = Field(ge=0, le=2**40)
    val_accuracy: Fraction  # on its group's classes of a held-out seeded slice (0 when not measured)


class HeldWorker(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: int = Field(ge=0, lt=MAX_GROUPS + MAX_PARITY)
    units: list[HeldUnit] = Field(min_length=1, max_length=MAX_GROUPS)


class ClassParSubnet(Record):
    """What a peer holds and serves: under ``classpar-subnets``, subkey = its peer id."""

    KIND: ClassVar[str] = "ClassParSubnet"

    peer_id: PeerId
    job: Name
    teacher_sha256: Sha256  # the teacher its sub-networks were pruned from
    groups: Groups  # the grouping they were built for
    held: list[HeldWorker] = Field(min_length=1, max_length=MAX_GROUPS + MAX_PARITY)
    issued_at: NonNegFloat

    @model_validator(mode="after")
    def _distinct(self) -> ClassParSubnet:
        if len({h.worker for h in self.held}) != len(self.held):
            raise ValueError("a worker is listed twice")
        if any(u.unit >= len(self.groups) for h in self.held for u in h.units):
            raise ValueError("a unit names a group the grouping does not have")
        return self

    def matches(self, plan: ClassParPlan) -> bool:
        """Built for ``plan``'s teacher and grouping."""
        return self.teacher_sha256 == plan.teacher_sha256 and self.groups == plan.groups

    def unit_hashes(self) -> dict[int, str]:
        return {u.unit: u.sha256 for h in self.held for u in h.units}
