//! The mixture-of-experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): a router scores the experts
//! for each token, the token goes through its `top_k` best, and their outputs are summed weighted by the
//! router's probabilities.
//!
//! Routing is decided on the host: the router's probabilities are read back (one small sync per block), the
//! tokens are sorted by expert, and each expert runs one product over exactly its tokens. The weights stay on
//! the GPU and in the graph (a gather of the probabilities), so the router trains as in transformers; the choice
//! of experts itself has no gradient there either.

use hierarchos_core::{DType, Tensor, grad_enabled};

use crate::error::{Error, Result};
use crate::linear::{Linear, prefixed};
use crate::mlp::Mlp;

/// A sparse mixture of gated-MLP experts, with an optional shared expert every token goes through.
#[derive(Clone, Debug)]
pub struct Moe {
    /// The block's module name in checkpoints (`mlp`, or Mixtral's `block_sparse_moe`).
    pub name: &'static str,
    /// The router, `[num_experts, hidden]` (the checkpoints' `gate`).
    pub gate: Linear,
    /// The routed experts.
    pub experts: Vec<Mlp>,
    /// Experts per token.
    pub top_k: usize,
    /// The chosen probabilities are divided by their sum.
    pub normalize_top_k: bool,
    /// Qwen2-MoE's shared expert and its gate (`[1, hidden]`, through a sigmoid).
    pub shared_expert: Option<(Mlp, Linear)>,
}

/// Which experts each token goes to: `chosen[t * k + j]` is token `t`'s `j`-th best expert.
struct Routing {
    chosen: Vec<u32>,
    /// The assignments `t * k + j` sorted by expert, then token: each expert's tokens are one run.
    order: Vec<u32>,
    /// How many assignments each expert has.
    counts: Vec<usize>,
}

impl Routing {
    /// The `k` most probable experts of each row of `probs` (`[tokens, experts]`), ties to the lower index.
    fn top_k(probs: &[f32], experts: usize, k: usize) -> Routing {
        let mut chosen = Vec::with_capacity(probs.len() / experts * k);
        let mut ranked: Vec<u32> = Vec::with_capacity(experts);
        for row in probs.chunks_exact(experts) {
            ranked.clear();
            ranked.extend(0..experts as u32);
            ranked.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            chosen.extend_from_slice(&ranked[..k]);
        }
        let mut order: Vec<u32> = (0..chosen.len() as u32).collect();
        order.sort_by_key(|&a| (chosen[a as usize], a));
        let mut counts = vec![0; experts];
        for &e in &chosen {
            counts[e as usize] += 1;
        }
        Routing { chosen, order, counts }
    }
}

/// The router's probabilities on the host, where the experts are chosen.
#[cfg(not(target_arch = "wasm32"))]
fn read_probabilities(probs: &Tensor) -> Result<Vec<f32>> {
    let host: Vec<f32> = probs.to_vec()?;
    if host.iter().any(|p| !p.is_finite()) {
        return Err(Error::Invalid(
            "mixture of experts: the router's probabilities are not finite".into(),
        ));
    }
    Ok(host)
}

/// In the browser a blocking readback is impossible, so routed experts cannot run there.
#[cfg(target_arch = "wasm32")]
fn read_probabilities(_probs: &Tensor) -> Result<Vec<f32>> {
    Err(Error::Invalid(
        "mixture of experts: routing reads the router's probabilities back, which the browser cannot do \
         synchronously"
            .into(),
    ))
}

impl Moe {
    /// The block on `x` (`[..., hidden]`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let hidden = *shape.last().unwrap_or(&0);
        let n = x.numel() / hidden.max(1);
        let (e, k) = (self.experts.len(), self.top_k);
        if n == 0 {
            return Ok(x.zeros_like()?);
        }
        let x2 = x.reshape(&[n, hidden])?;
        // As transformers: the router's softmax in f32 whatever the activations' dtype.
        let probs = self.gate.forward(&x2)?.to_dtype(DType::F32)?.softmax(-1)?;
        let routing = Routing::top_k(&read_probabilities(&probs)?, e, k);
        let device = x.device();
        let chosen = Tensor::from_slice(&routing.chosen, &[n, k], device)?;
        let mut weights = probs.gather(1, &chosen)?;
        if self.normalize_top_k {
            weights = weights.div(&weights.sum(&[-1], true)?)?;
        }
        let tokens: Vec<u32> = routing.order.iter().map(|&a| a / k as u32).collect();
        let routed = x2.index_select(0, &Tensor::from_slice(&tokens, &[n * k], device)?)?;
        let mut outputs = Vec::new();
        let mut start = 0;
        for (expert, &count) in self.experts.iter().zip(&routing.counts) {
            // An expert no token chose still joins a training graph, with zero rows: its gradient is then zero,
            // not absent, and AdamW decays and moves it as transformers' (3-D expert tensors) does.
            let trains = || expert.linears().iter().any(|(_, l)| l.requires_grad());
            if count > 0 || (grad_enabled() && trains()) {
                outputs.push(expert.forward(&routed.narrow(0, start, count)?, None, None)?);
                start += count;
            }
        }
        // Back from expert order to token order: assignment a sits at position[a].
        let mut position = vec![0u32; n * k];
        for (p, &a) in routing.order.iter().enumerate() {
            position[a as usize] = p as u32;
        }
        let position = Tensor::from_slice(&position, &[n * k], device)?;
        let per_slot = Tensor::cat(&outputs, 0)?
            .index_select(0, &position)?
            .reshape(&[n, k, hidden])?;
        let weights = weights.to_dtype(per_slot.dtype())?.unsqueeze(-1)?;
        let mut out = per_slot.mul(&weights)?.sum(&[1], false)?;
        if let Some((shared, shared_gate)) = &self.shared_expert {
            let scale = shared_gate.forward(&x2)?.sigmoid()?;
            out = out.add(&shared.forward(&x2, None, None)?.mul(&scale)?)?;
        }
        Ok(out.reshape(&shape)?)
    }

    /// The linear layers with their module paths inside the block (`gate`, `experts.0.w1`, ...,
    /// `shared_expert.gate_proj`, `shared_expert_gate`), in module order.
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        let mut v = vec![("gate".to_string(), &self.gate)];
        for (i, expert) in self.experts.iter().enumerate() {
            v.extend(prefixed(&format!("experts.{i}"), expert.linears()));
        }
        if let Some((shared, gate)) = &self.shared_expert {
            v.extend(prefixed("shared_expert", shared.linears()));
            v.push(("shared_expert_gate".to_string(), gate));
        }
        v
    }

    /// [`Moe::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut v = vec![("gate".to_string(), &mut self.gate)];
        for (i, expert) in self.experts.iter_mut().enumerate() {
            v.extend(prefixed(&format!("experts.{i}"), expert.linears_mut()));
        }
        if let Some((shared, gate)) = &mut self.shared_expert {
            v.extend(prefixed("shared_expert", shared.linears_mut()));
            v.push(("shared_expert_gate".to_string(), gate));
        }
        v
    }

    /// The parameters with their names in checkpoints (`gate.weight`, `experts.0.w1.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.linears()
            .into_iter()
            .flat_map(|(name, l)| prefixed(&name, l.parameters()))
            .collect()
    }
}
