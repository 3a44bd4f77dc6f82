use thiserror::Error;

/// An error from MLX (its exception message) or from a check on this side of the bridge.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("mlx: {0}")]
    Mlx(String),
    #[error("dtype mismatch: array is {actual:?}, asked for {expected:?}")]
    Dtype { expected: crate::Dtype, actual: crate::Dtype },
    #[error("{0}")]
    Invalid(String),
}

impl From<cxx::Exception> for Error {
    fn from(e: cxx::Exception) -> Self {
        Error::Mlx(e.what().to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
