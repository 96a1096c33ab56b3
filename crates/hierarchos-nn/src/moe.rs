//! The mixture-of-experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3): a router scores
//! the experts for each token, the token goes through its `top_k` best, and their outputs are summed weighted by
//! the router's scores.
//!
//! Routing is decided on the host: the router's scores are read back (one small sync per block), the tokens are
//! sorted by expert, and each expert runs one product over exactly its tokens. The weights stay on the GPU and in
//! the graph (a gather of the scores), so the router trains as in transformers; the choice of experts itself has
//! no gradient there either.

use hierarchos_core::{DType, Tensor, grad_enabled};

use crate::config::RouterScoring;
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
    /// How the router scores the experts.
    pub scoring: RouterScoring,
    /// DeepSeek-V3's `e_score_correction_bias` (`[experts]`), added to the scores that choose the experts, not
    /// to those that weight them. A buffer: checkpoints hold it and training leaves it.
    pub correction_bias: Option<Tensor>,
    /// The chosen weights are multiplied by it (DeepSeek-V3's `routed_scaling_factor`).
    pub routed_scaling_factor: f64,
    /// The expert every token also goes through.
    pub shared_expert: Option<SharedExpert>,
}

/// An expert every token goes through besides its routed ones.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// Its module name in the block (`shared_expert`, DeepSeek-V3's `shared_experts`).
    pub name: &'static str,
    /// The expert.
    pub mlp: Mlp,
    /// Qwen2-MoE's `shared_expert_gate` (`[1, hidden]`), whose sigmoid scales the expert's output.
    pub gate: Option<Linear>,
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
    /// The `k` best-scored experts of each row of `scores` (`[tokens, experts]`) within the `top_groups` of
    /// `groups` equal groups whose two best scores sum highest (all of them when `top_groups == groups`); ties go
    /// to the lower index.
    fn top_k(scores: &[f32], experts: usize, k: usize, groups: usize, top_groups: usize) -> Routing {
        let per_group = experts / groups;
        let best = |a: &u32, b: &u32, of: &[f32]| of[*b as usize].total_cmp(&of[*a as usize]).then(a.cmp(b));
        let mut chosen = Vec::with_capacity(scores.len() / experts * k);
        let mut ranked: Vec<u32> = Vec::with_capacity(experts);
        let mut group_scores = vec![0.0f32; groups];
        let mut ranked_groups: Vec<u32> = Vec::with_capacity(groups);
        for row in scores.chunks_exact(experts) {
            ranked.clear();
            if top_groups < groups {
                for (g, group) in row.chunks_exact(per_group).enumerate() {
                    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                    for &s in group {
                        if s > first {
                            (first, second) = (s, first);
                        } else if s > second {
                            second = s;
                        }
                    }
                    group_scores[g] = first + second;
                }
                ranked_groups.clear();
                ranked_groups.extend(0..groups as u32);
                ranked_groups.sort_by(|a, b| best(a, b, &group_scores));
                for &g in &ranked_groups[..top_groups] {
                    let start = g as usize * per_group;
                    ranked.extend(start as u32..(start + per_group) as u32);
                }
            } else {
                ranked.extend(0..experts as u32);
            }
            ranked.sort_by(|a, b| best(a, b, row));
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

/// The router's scores on the host, where the experts are chosen.
#[cfg(not(target_arch = "wasm32"))]
fn read_scores(scores: &Tensor) -> Result<Vec<f32>> {
    let host: Vec<f32> = scores.to_vec()?;
    if host.iter().any(|p| !p.is_finite()) {
        return Err(Error::Invalid(
            "mixture of experts: the router's scores are not finite".into(),
        ));
    }
    Ok(host)
}

/// In the browser a blocking readback is impossible, so routed experts cannot run there.
#[cfg(target_arch = "wasm32")]
fn read_scores(_scores: &Tensor) -> Result<Vec<f32>> {
    Err(Error::Invalid(
        "mixture of experts: routing reads the router's scores back, which the browser cannot do synchronously".into(),
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
        // As transformers: the router's scores in f32 whatever the activations' dtype.
        let logits = self.gate.forward(&x2)?.to_dtype(DType::F32)?;
        let (scores, groups, top_groups) = match self.scoring {
            RouterScoring::Softmax => (logits.softmax(-1)?, 1, 1),
            RouterScoring::GroupedSigmoid { groups, top_groups } => (logits.sigmoid()?, groups, top_groups),
        };
        let for_choice = match &self.correction_bias {
            Some(bias) => scores.add(&bias.to_dtype(DType::F32)?)?,
            None => scores.clone(),
        };
        let routing = Routing::top_k(&read_scores(&for_choice)?, e, k, groups, top_groups);
        let device = x.device();
        let chosen = Tensor::from_slice(&routing.chosen, &[n, k], device)?;
        let mut weights = scores.gather(1, &chosen)?;
        if self.normalize_top_k {
            weights = weights.div(&weights.sum(&[-1], true)?)?;
        }
        if self.routed_scaling_factor != 1.0 {
            weights = weights.mul_scalar(self.routed_scaling_factor)?;
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
        if let Some(shared) = &self.shared_expert {
            let y = shared.mlp.forward(&x2, None, None)?;
            out = out.add(&match &shared.gate {
                Some(gate) => y.mul(&gate.forward(&x2)?.sigmoid()?)?,
                None => y,
            })?;
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
        if let Some(shared) = &self.shared_expert {
            v.extend(prefixed(shared.name, shared.mlp.linears()));
            v.extend(shared.gate.iter().map(|g| ("shared_expert_gate".to_string(), g)));
        }
        v
    }

    /// [`Moe::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut v = vec![("gate".to_string(), &mut self.gate)];
        for (i, expert) in self.experts.iter_mut().enumerate() {
            v.extend(prefixed(&format!("experts.{i}"), expert.linears_mut()));
        }
        if let Some(shared) = &mut self.shared_expert {
            v.extend(prefixed(shared.name, shared.mlp.linears_mut()));
            v.extend(shared.gate.iter_mut().map(|g| ("shared_expert_gate".to_string(), g)));
        }
        v
    }

    /// The tensors checkpoints hold beside the parameters, by name in the block (`gate.e_score_correction_bias`).
    pub fn buffers(&self) -> Vec<(String, Tensor)> {
        let bias = self.correction_bias.iter();
        bias.map(|b| ("gate.e_score_correction_bias".to_string(), b.clone()))
            .collect()
    }

    /// The parameters with their names in checkpoints (`gate.weight`, `experts.0.w1.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.linears()
            .into_iter()
            .flat_map(|(name, l)| prefixed(&name, l.parameters()))
            .collect()
    }
}
