//! The key/value cache of a decoder: preallocated per-layer buffers that each forward appends to in place, so a
//! generation step computes only the new positions and copies nothing it already has.

use hierarchos_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Keys and values of every layer for up to `max_len` positions of `batch` sequences.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer, keys and values `[batch, kv_heads, max_len, head_dim]` (f32, post-rotary keys).
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
    max_len: usize,
    batch: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers of `kv_heads` heads of `head_dim`.
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        device: &Device,
    ) -> Result<KvCache> {
        if batch == 0 || max_len == 0 {
            return Err(Error::Invalid(format!(
                "kv cache: batch ({batch}) and max_len ({max_len}) must be positive"
            )));
        }
        let shape = [batch, kv_heads, max_len, head_dim];
        let layers = (0..layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(&shape, DType::F32, device)?,
                    Tensor::zeros(&shape, DType::F32, device)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            len: 0,
            max_len,
            batch,
        })
    }

    /// Positions held (the position the next token gets).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the buffers have room for.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Layers it holds keys and values for.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Sequences per batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Makes room for `more` positions after those held, growing every buffer to twice its length at least (so
    /// that growing token by token copies the cache now and then, not each time): generation sizes its cache
    /// for the prompt and a first stretch of tokens, not for all it may generate, as transformers' growing cache
    /// does, so a large `max_new_tokens` that an end-of-sequence token cuts short costs nothing.
    pub(crate) fn reserve(&mut self, more: usize) -> Result<()> {
        let needed = self
            .len
            .checked_add(more)
            .ok_or_else(|| Error::Invalid("kv cache: too many positions".into()))?;
        if needed <= self.max_len {
            return Ok(());
        }
        let max_len = needed.max(2 * self.max_len);
        for (k, v) in &mut self.layers {
            for t in [k, v] {
                let mut shape = t.shape().to_vec();
                shape[2] = max_len;
                let grown = Tensor::zeros(&shape, t.dtype(), t.device())
                    .map_err(|e| Error::Invalid(format!("kv cache: growing to {max_len} positions: {e}")))?;
                if self.len > 0 {
                    grown.write_at(2, 0, &t.narrow(2, 0, self.len)?)?;
                }
                *t = grown;
            }
        }
        self.max_len = max_len;
        Ok(())
    }

    /// Forgets positions from `len` on (to reuse a prompt prefix, or to start over with 0). The buffers are
    /// kept; stale entries are overwritten before they are read again.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Stores the new keys and values `[batch, kv_heads, T, head_dim]` of `layer` at positions `len..len + T`
    /// and returns the cached keys and values of positions `from..len + T` as views (no copy).
    pub(crate) fn append(&self, layer: usize, k: &Tensor, v: &Tensor, from: usize) -> Result<(Tensor, Tensor)> {
        let (kc, vc) = &self.layers[layer];
        kc.write_at(2, self.len, k)?;
        vc.write_at(2, self.len, v)?;
        self.cached(layer, from, self.len + k.shape()[2])
    }

    /// Views of the key and value buffers of `layer` over positions `len..len + t`, where a step's new keys and
    /// values are to be written.
    pub(crate) fn new_positions(&self, layer: usize, t: usize) -> Result<(Tensor, Tensor)> {
        self.cached(layer, self.len, self.len + t)
    }

    /// The whole key and value buffers of `layer` (`[batch, kv_heads, max_len, head_dim]`).
    pub(crate) fn buffers(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Views of the keys and values of `layer` at positions `from..to`.
    pub(crate) fn cached(&self, layer: usize, from: usize, to: usize) -> Result<(Tensor, Tensor)> {
        let (kc, vc) = &self.layers[layer];
        Ok((kc.narrow(2, from, to - from)?, vc.narrow(2, from, to - from)?))
    }

    /// Marks `n` more positions as filled once every layer has appended them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
