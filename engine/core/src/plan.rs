//! Planning: a graph's values placed in one arena (offsets proven not to overlap while live),
//! which ops must wait for the ones before them, and the memory a plan will hold, checked
//! against a budget before anything is allocated.

use crate::error::{EngineError, Result};
use crate::graph::{Graph, Op, ValueId};
use crate::memory::ALIGN;

/// Memory a session owns, computed from its plan. Weights are mapped from the file, not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    /// Mapped weight bytes the graph reads.
    pub weights_bytes: u64,
    /// KV cache.
    pub kv_bytes: u64,
    /// Arena (all activations), as planned.
    pub arena_bytes: u64,
    /// Peak of simultaneously-live activation bytes: no plan can be smaller.
    pub arena_lower_bound_bytes: u64,
    /// Per-thread scratch of the kernels.
    pub scratch_bytes: u64,
    /// Heap of the loaded model besides its weights (tokenizer, metadata), as measured at load
    /// ([`crate::model::Model::runtime_bytes`]); shared by all sessions of the model, not planned, not
    /// charged to a budget, but part of the total the process uses.
    pub runtime_bytes: u64,
}

impl MemoryReport {
    /// What a budget is charged for it.
    pub fn demand(&self) -> edge_targets::Demand {
        edge_targets::Demand {
            weights: self.weights_bytes,
            kv: self.kv_bytes,
            arena: self.arena_bytes,
            scratch: self.scratch_bytes,
        }
    }

    /// What the session allocates: KV cache + arena + scratch (weights excluded: mapped).
    pub fn owned_bytes(&self) -> u64 {
        self.kv_bytes + self.arena_bytes + self.scratch_bytes
    }

    /// Owned bytes plus the mapped weights: what a budget that counts weights is charged.
    pub fn owned_with_weights_bytes(&self) -> u64 {
        self.owned_bytes() + self.weights_bytes
    }

    /// Everything the process holds for the model and this session: owned, mapped weights and
    /// the model's runtime heap.
    pub fn total_bytes(&self) -> u64 {
        self.owned_with_weights_bytes() + self.runtime_bytes
    }
}

/// A plan of the given size (a context, or the longest text an encoder takes), or without one
/// the largest size up to `max` that fits `budget`; refused before anything is allocated,
/// naming each component and the largest size that would fit (`with_largest_fitting_ctx`).
pub fn plan_within_budget<P>(
    given: Option<usize>,
    max: u64,
    budget: &edge_targets::Budget,
    plan: impl Fn(usize) -> Result<P>,
    demand: impl Fn(&P) -> edge_targets::Demand,
) -> Result<P> {
    let probe = |n: u64| match plan(n as usize) {
        Ok(p) => demand(&p),
        // An impossible size never fits.
        Err(_) => edge_targets::Demand {
            weights: u64::MAX,
            ..Default::default()
        },
    };
    let largest = || edge_targets::largest_fitting(budget, 1, max, probe);
    let size = match given {
        Some(n) => n,
        None => match largest() {
            Some(n) => return plan(n as usize),
            // Nothing fits: plan the smallest, whose check below names the components.
            None => 1,
        },
    };
    let p = plan(size)?;
    budget
        .check(&demand(&p))
        .map_err(|e| EngineError::Budget(Box::new(e.with_largest_fitting_ctx(largest()))))?;
    Ok(p)
}

/// A graph with its values placed in one arena: offsets proven sound, and the barriers its
/// ops need.
#[derive(Clone)]
pub struct PlannedGraph {
    /// The graph.
    pub graph: Graph,
    /// Byte offset of each value in the arena.
    pub offsets: Vec<usize>,
    /// Bytes of the arena the offsets fit in.
    pub arena_bytes: usize,
    /// Peak of simultaneously-live value bytes: no plan of this graph can be smaller.
    pub lower_bound_bytes: usize,
    /// Whether the threads meet at a barrier after each op (see `sync_points`).
    pub(crate) sync_after: Vec<bool>,
}

impl PlannedGraph {
    /// Plans `graph` into an arena and proves the plan sound: values live at the same time
    /// never overlap, except an elementwise op's output exactly on an input that dies there
    /// (the executors' memory safety depends on it, so this runs in every build).
    pub fn plan(graph: Graph) -> Result<PlannedGraph> {
        let buffers = graph.buffers(ALIGN);
        let inplace = graph.inplace_pairs();
        let plan = edge_arena::plan_with_inplace(&buffers, &inplace)
            .map_err(|e| EngineError::Plan(e.to_string()))?;
        edge_arena::check_with_inplace(&buffers, &plan.offsets, plan.size, &inplace)
            .map_err(|e| EngineError::Plan(e.to_string()))?;
        let mut pg = PlannedGraph::with_offsets(graph, plan.offsets);
        pg.arena_bytes = plan.size;
        pg.lower_bound_bytes = plan.lower_bound;
        Ok(pg)
    }

    /// The graph at offsets given by hand (tests of the barrier analysis: never run).
    pub(crate) fn with_offsets(graph: Graph, offsets: Vec<usize>) -> PlannedGraph {
        let sync_after = sync_points(&graph, &offsets);
        PlannedGraph {
            graph,
            offsets,
            arena_bytes: 0,
            lower_bound_bytes: 0,
            sync_after,
        }
    }

    /// Whether the ops after op `i` may read or write what it and the ops since the last
    /// barrier write (see `sync_points`): then all threads must finish `i` first.
    #[inline]
    pub fn barrier_after(&self, i: usize) -> bool {
        self.sync_after[i]
    }

    /// Barriers one run of the graph costs (for tests and the curious).
    pub fn n_barriers(&self) -> usize {
        self.sync_after.iter().filter(|&&b| b).count()
    }
}

/// What an op reads and writes: arena byte ranges, and the KV cache.
struct Access {
    reads: Vec<std::ops::Range<usize>>,
    writes: Vec<std::ops::Range<usize>>,
    reads_kv: bool,
    writes_kv: bool,
}

impl Access {
    fn of(op: &Op, graph: &Graph, offsets: &[usize]) -> Access {
        let range = |v: ValueId| offsets[v.0]..offsets[v.0] + graph.values[v.0].bytes();
        let mut reads: Vec<ValueId> = op.inputs();
        // `inputs` leaves out `x + x` (for the in-place planner); it is still a read.
        if let Op::Add { a, b, .. } = *op {
            reads = vec![a, b];
        }
        Access {
            reads: reads.into_iter().map(range).collect(),
            writes: op.output().into_iter().map(range).collect(),
            reads_kv: matches!(op, Op::Attention(_)),
            writes_kv: matches!(op, Op::StoreKv { .. }),
        }
    }

    /// Whether running `self` and `later` concurrently could race: one writes what the other
    /// reads or writes.
    fn conflicts(&self, later: &Access) -> bool {
        let overlap = |a: &[std::ops::Range<usize>], b: &[std::ops::Range<usize>]| {
            a.iter()
                .any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
        };
        overlap(&self.writes, &later.reads)
            || overlap(&self.writes, &later.writes)
            || overlap(&later.writes, &self.reads)
            || (self.writes_kv && (later.reads_kv || later.writes_kv))
            || (later.writes_kv && self.reads_kv)
    }
}

/// For each op, whether the threads must meet after it. Ops that neither read nor write what
/// the ops since the last barrier write (compared as arena byte ranges, since the planner lets
/// values share memory, plus the KV cache) run without one: e.g. the query, key and value
/// matmuls, or the gate and up matmuls, one after the other with a single barrier at the end.
/// A 135M model's decode step runs about 600 ops of a few microseconds each, so every barrier
/// saved counts. The last op always has one.
fn sync_points(graph: &Graph, offsets: &[usize]) -> Vec<bool> {
    let n = graph.ops.len();
    let mut sync = vec![true; n];
    let mut epoch: Vec<Access> = Vec::new();
    for (i, op) in graph.ops.iter().enumerate() {
        let access = Access::of(op, graph, offsets);
        if i > 0 {
            let meet = epoch.iter().any(|e| e.conflicts(&access));
            sync[i - 1] = meet;
            if meet {
                epoch.clear();
            }
        }
        epoch.push(access);
    }
    sync
}

#[cfg(test)]
mod sync_tests {
    use super::*;
    use crate::graph::{ValueType, WeightId};

    /// Values of 4 f32 (16 bytes) each; offsets given by hand so that aliasing can be staged.
    fn graph(n_values: usize) -> (Graph, Vec<ValueId>) {
        let mut g = Graph::new(1);
        let v = (0..n_values)
            .map(|i| g.value(format!("v{i}"), 1, 4, ValueType::F32))
            .collect();
        (g, v)
    }

    fn matmul(x: ValueId, out: ValueId) -> Op {
        Op::MatMul {
            weight: WeightId(0),
            x,
            out,
        }
    }

    #[test]
    fn independent_ops_share_one_barrier() {
        // q, k, v = W·x (independent), then q + k reads two of them.
        let (mut g, v) = graph(5);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[0], v[2]));
        g.push(matmul(v[0], v[3]));
        g.push(Op::Add {
            a: v[1],
            b: v[2],
            out: v[4],
        });
        let offsets = (0..5).map(|i| i * 16).collect();
        let pg = PlannedGraph::with_offsets(g, offsets);
        assert_eq!(pg.sync_after, [false, false, true, true]);
        assert_eq!(pg.n_barriers(), 2);
    }

    #[test]
    fn a_dependency_two_ops_back_still_meets() {
        // A writes v1; B is independent of A; C reads A's output: the barrier goes before C.
        let (mut g, v) = graph(4);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[0], v[2]));
        g.push(matmul(v[1], v[3]));
        let pg = PlannedGraph::with_offsets(g, vec![0, 16, 32, 48]);
        assert_eq!(pg.sync_after, [false, true, true]);
    }

    #[test]
    fn shared_arena_bytes_are_a_dependency() {
        // B's output is planned over A's input (A's input dies at A): B must wait for A.
        let (mut g, v) = graph(4);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[2], v[3]));
        let pg = PlannedGraph::with_offsets(g, vec![0, 16, 32, 8]);
        assert_eq!(pg.sync_after, [true, true]);
    }

    #[test]
    fn the_cache_orders_store_and_attention() {
        let (mut g, v) = graph(4);
        g.push(Op::StoreKv {
            k: v[0],
            v: v[1],
            layer: 0,
            head_dim: 4,
        });
        g.push(Op::Attention(crate::graph::Attention {
            q: v[2],
            layer: 0,
            n_head: 1,
            n_head_kv: 1,
            head_dim: 4,
            scale: 1.0,
            window: None,
            softcap: None,
            out: v[3],
        }));
        let pg = PlannedGraph::with_offsets(g, vec![0, 16, 32, 48]);
        assert_eq!(pg.sync_after, [true, true]);
    }
}
