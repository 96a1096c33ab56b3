//! GGUF files (llama.cpp's single-file format): the container, and the model configuration, tokenizer and weights
//! stored in it, turned into what a Hugging Face folder would give.

pub mod config;
pub mod reader;
pub mod tensors;
#[cfg(not(target_arch = "wasm32"))]
pub mod tokenizer;

pub use config::{architecture, model_config};
pub use hierarchos_core::quant::GgmlType;
pub use reader::{DEFAULT_ALIGNMENT, Gguf, MAGIC, TensorInfo, Value, ValueType};
pub use tensors::gguf_name;
#[cfg(not(target_arch = "wasm32"))]
pub use tokenizer::tokenizer;
