//! The tape: every differentiable op attaches a [`Node`] holding its backward rule to its result, and
//! [`Tensor::backward`] walks the nodes in reverse topological order.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::autocast::AutocastScope;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A backward rule: gradient of the output in, gradients of each input out (`None` for inputs that need none).
/// It owns the tensors it saved, so running it (once) frees them.
pub(crate) type BackwardFn = Box<dyn FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// A backward rule that is also handed the gradient gathered so far for its first input (`None` when there is
/// none yet) and returns that input's gradient with it already added: the add happens inside the rule's own
/// kernel instead of in a launch and a pass over memory of its own (a residual stream's gradient meeting the
/// gradient through the norm that reads it).
pub(crate) type AddingBackwardFn =
    Box<dyn FnOnce(&Tensor, Option<Tensor>) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// A node's rule, of either kind.
enum Backward {
    Plain(BackwardFn),
    Adding(AddingBackwardFn),
}

/// Where a gradient flows: into a leaf's `.grad` or into another node.
#[derive(Clone)]
pub(crate) enum Edge {
    Leaf(Arc<GradCell>),
    Node(Arc<Node>),
}

/// The gradient slot of a leaf tensor; shared between the leaf and the edges that point at it.
#[derive(Default)]
pub(crate) struct GradCell {
    pub(crate) grad: Mutex<Option<Tensor>>,
}

/// One recorded op.
pub(crate) struct Node {
    id: usize,
    pub(crate) name: &'static str,
    edges: Vec<Option<Edge>>,
    backward: Mutex<Option<Backward>>,
    /// The op only looks at its input's storage another way (transpose, reshape, ...).
    view: bool,
    /// The op is a `narrow` of its input: where the input is itself recorded, the gradient is handed to it as a
    /// slice (see [`Pending`]) instead of being padded with zeros by the backward rule.
    narrow: Option<Narrow>,
    /// Each input's count of in-place writes and its value when the op ran: a write in between would make the
    /// backward read values the forward did not (torch refuses this too).
    inputs_written: Vec<(Arc<AtomicU64>, u64)>,
}

/// Where a `narrow` cut its input: from `start` along `dim`, whose whole length is `full`.
#[derive(Clone, Copy)]
pub(crate) struct Narrow {
    pub(crate) dim: usize,
    pub(crate) start: usize,
    pub(crate) full: usize,
}

/// The gradient of a narrowed input: `g` placed at `narrow`, zeros elsewhere.
fn pad(g: &Tensor, narrow: Narrow) -> Result<Tensor> {
    join(&[(narrow.start, g.clone())], narrow.dim, narrow.full)
}

/// One tensor of length `full` along `dim` holding each `(start, g)` at `start` and zeros between them; the
/// pieces are sorted and do not overlap.
fn join(pieces: &[(usize, Tensor)], dim: usize, full: usize) -> Result<Tensor> {
    let first = &pieces[0].1;
    let mut shape = first.shape().to_vec();
    let mut parts = Vec::with_capacity(2 * pieces.len() + 1);
    let mut at = 0;
    let mut zeros = |from: usize, to: usize, parts: &mut Vec<Tensor>| -> Result<()> {
        if to > from {
            shape[dim] = to - from;
            parts.push(Tensor::zeros(&shape, first.dtype(), first.device())?);
        }
        Ok(())
    };
    for (start, g) in pieces {
        zeros(at, *start, &mut parts)?;
        parts.push(g.clone());
        at = start + g.shape()[dim];
    }
    zeros(at, full, &mut parts)?;
    match parts.as_slice() {
        [whole] => Ok(whole.clone()),
        // Pieces already side by side in one buffer (the halves of the gated MLP's gradient) need no copy.
        _ => match Tensor::cat_view(&parts, dim as isize)? {
            Some(whole) => Ok(whole),
            None => Tensor::cat(&parts, dim as isize),
        },
    }
}

/// A node's gradient while backward gathers it. Gradients of its narrowed views are kept as slices until the
/// node runs, so that slices which tile it (the q, k and v cut from one projection) are joined by one `cat`
/// rather than each padded to the whole size and added.
#[derive(Default)]
struct Pending {
    whole: Option<Tensor>,
    slices: Vec<(Narrow, Tensor)>,
}

impl Pending {
    /// The gradient as one tensor: the slices along one dimension that do not overlap in one `cat`, any others
    /// padded, then everything added.
    fn into_tensor(mut self) -> Result<Option<Tensor>> {
        self.slices.sort_by_key(|(n, _)| (n.dim, n.start));
        let mut total = self.whole;
        let mut rest = self.slices.into_iter().peekable();
        while let Some((n, g)) = rest.next() {
            let mut end = n.start + g.shape()[n.dim];
            let mut pieces = vec![(n.start, g)];
            while let Some((m, g)) = rest.next_if(|(m, _)| m.dim == n.dim && m.start >= end) {
                end = m.start + g.shape()[m.dim];
                pieces.push((m.start, g));
            }
            accumulate(&mut total, join(&pieces, n.dim, n.full)?)?;
        }
        Ok(total)
    }
}

static NEXT_NODE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops record to the tape on this thread (false inside [`no_grad`]).
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` without recording any op, like PyTorch's `torch.no_grad()`: for inference, optimizer updates and
/// backward itself.
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

impl Node {
    /// Records an op whose inputs are `inputs`; `None` when no input needs a gradient (or grad is off).
    pub(crate) fn record(name: &'static str, inputs: &[&Tensor], backward: BackwardFn) -> Option<Arc<Node>> {
        Node::new(name, inputs, Backward::Plain(backward), false, None)
    }

    /// [`Node::record`] for a view of `input`.
    pub(crate) fn record_view(name: &'static str, input: &Tensor, backward: BackwardFn) -> Option<Arc<Node>> {
        Node::new(name, &[input], Backward::Plain(backward), true, None)
    }

    /// [`Node::record_view`] for `narrow`, whose gradient [`run_backward`] may hand on as a slice.
    pub(crate) fn record_narrow(input: &Tensor, narrow: Narrow) -> Option<Arc<Node>> {
        Node::new(
            "narrow",
            &[input],
            Backward::Plain(Box::new(move |g| Ok(vec![Some(pad(g, narrow)?)]))),
            true,
            Some(narrow),
        )
    }

    /// [`Node::record`] for a rule that adds the gradient gathered so far for its first input itself.
    pub(crate) fn record_adding(
        name: &'static str,
        inputs: &[&Tensor],
        backward: AddingBackwardFn,
    ) -> Option<Arc<Node>> {
        Node::new(name, inputs, Backward::Adding(backward), false, None)
    }

    fn new(
        name: &'static str,
        inputs: &[&Tensor],
        backward: Backward,
        view: bool,
        narrow: Option<Narrow>,
    ) -> Option<Arc<Node>> {
        if !grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return None;
        }
        Some(Arc::new(Node {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            name,
            edges: inputs.iter().map(|t| t.edge()).collect(),
            backward: Mutex::new(Some(backward)),
            view,
            narrow,
            inputs_written: inputs.iter().map(|t| t.write_count()).collect(),
        }))
    }

    /// Whether the op is a view of a leaf, or of a view of one, and so on.
    pub(crate) fn views_a_leaf(&self) -> bool {
        self.view
            && match self.edges.as_slice() {
                [Some(Edge::Leaf(_))] => true,
                [Some(Edge::Node(n))] => n.views_a_leaf(),
                _ => false,
            }
    }
}

fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(prev) => prev.add(&g)?,
    });
    Ok(())
}

/// Runs backward from `root` (whose gradient is `seed`), accumulating into the leaves' `.grad`.
pub(crate) fn run_backward(root: &Arc<Node>, seed: Tensor) -> Result<()> {
    // Topological order by iterative depth-first search.
    let mut order: Vec<Arc<Node>> = Vec::new();
    let mut visited: HashMap<usize, ()> = HashMap::new();
    let mut stack: Vec<(Arc<Node>, usize)> = vec![(root.clone(), 0)];
    visited.insert(root.id, ());
    while let Some((node, next)) = stack.pop() {
        let child = node.edges.iter().skip(next).enumerate().find_map(|(k, e)| match e {
            Some(Edge::Node(n)) if !visited.contains_key(&n.id) => Some((k + next, n.clone())),
            _ => None,
        });
        match child {
            Some((k, n)) => {
                stack.push((node, k + 1));
                visited.insert(n.id, ());
                stack.push((n, 0));
            }
            None => order.push(node),
        }
    }
    let _autocast_off = AutocastScope::enter(None);
    no_grad(|| {
        let mut grads: HashMap<usize, Pending> = HashMap::new();
        grads.insert(
            root.id,
            Pending {
                whole: Some(seed),
                ..Pending::default()
            },
        );
        for node in order.iter().rev() {
            let Some(g) = grads.remove(&node.id).map(Pending::into_tensor).transpose()?.flatten() else {
                continue;
            };
            let f = node
                .backward
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or_else(|| {
                    Error::Autograd(format!(
                        "backward through '{}' a second time: its saved tensors were freed by the first backward",
                        node.name
                    ))
                })?;
            if node
                .inputs_written
                .iter()
                .any(|(count, then)| count.load(Ordering::Acquire) != *then)
            {
                return Err(Error::Autograd(format!(
                    "an input of '{}' was written in place after the op ran: its gradient would read the new values",
                    node.name
                )));
            }
            if let (Some(narrow), [Some(Edge::Node(n))]) = (node.narrow, node.edges.as_slice()) {
                grads.entry(n.id).or_default().slices.push((narrow, g));
                continue;
            }
            let input_grads = match f {
                Backward::Plain(f) => f(&g)?,
                // A leaf's gradient may hold earlier backward passes' sums: only a node's is handed over.
                Backward::Adding(f) => {
                    let gathered = match node.edges.first() {
                        Some(Some(Edge::Node(n))) => grads.get_mut(&n.id).and_then(|p| p.whole.take()),
                        _ => None,
                    };
                    f(&g, gathered)?
                }
            };
            drop(g);
            for (edge, ig) in node.edges.iter().zip(input_grads) {
                let (Some(edge), Some(ig)) = (edge, ig) else {
                    continue;
                };
                match edge {
                    Edge::Leaf(cell) => {
                        // A leaf's gradient is its own: one that another leaf may also receive (an add hands the
                        // same gradient to both operands) is copied, so that writing into one leaf's `.grad` never
                        // changes another's.
                        let mut slot = cell.grad.lock().unwrap_or_else(|p| p.into_inner());
                        let shared = slot.is_none() && ig.is_cloned();
                        accumulate(&mut slot, if shared { ig.copy()? } else { ig })?
                    }
                    Edge::Node(n) => accumulate(&mut grads.entry(n.id).or_default().whole, ig)?,
                }
            }
        }
        Ok(())
    })
}
