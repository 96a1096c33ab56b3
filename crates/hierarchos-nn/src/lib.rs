//! Layers and optimizers for Hierarchos: plain structs whose fields are their parameters, named like the
//! Hugging Face tensors they load from, with a `forward` and a `parameters` list for optimizers and saving.

#![warn(missing_docs)]

mod init;
mod linear;
pub mod optim;

pub use init::ParamRng;
pub use linear::Linear;
