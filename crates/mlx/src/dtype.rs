use crate::ffi::ffi::DtypeCode;
use crate::{Error, Result};

/// MLX element types. The discriminants follow MLX's `Dtype::Val` order, like the bridge's `DtypeCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    Bool = 0,
    U8 = 1,
    U16 = 2,
    U32 = 3,
    U64 = 4,
    I8 = 5,
    I16 = 6,
    I32 = 7,
    I64 = 8,
    F16 = 9,
    F32 = 10,
    F64 = 11,
    BF16 = 12,
    C64 = 13,
}

impl Dtype {
    /// The bridge's code for this type.
    pub(crate) fn code(self) -> DtypeCode {
        match self {
            Dtype::Bool => DtypeCode::Bool,
            Dtype::U8 => DtypeCode::U8,
            Dtype::U16 => DtypeCode::U16,
            Dtype::U32 => DtypeCode::U32,
            Dtype::U64 => DtypeCode::U64,
            Dtype::I8 => DtypeCode::I8,
            Dtype::I16 => DtypeCode::I16,
            Dtype::I32 => DtypeCode::I32,
            Dtype::I64 => DtypeCode::I64,
            Dtype::F16 => DtypeCode::F16,
            Dtype::F32 => DtypeCode::F32,
            Dtype::F64 => DtypeCode::F64,
            Dtype::BF16 => DtypeCode::BF16,
            Dtype::C64 => DtypeCode::C64,
        }
    }

    /// The type of a bridge code; a code outside the shared enum is an error, never another type.
    pub(crate) fn from_code(code: DtypeCode) -> Result<Dtype> {
        Ok(match code {
            DtypeCode::Bool => Dtype::Bool,
            DtypeCode::U8 => Dtype::U8,
            DtypeCode::U16 => Dtype::U16,
            DtypeCode::U32 => Dtype::U32,
            DtypeCode::U64 => Dtype::U64,
            DtypeCode::I8 => Dtype::I8,
            DtypeCode::I16 => Dtype::I16,
            DtypeCode::I32 => Dtype::I32,
            DtypeCode::I64 => Dtype::I64,
            DtypeCode::F16 => Dtype::F16,
            DtypeCode::F32 => Dtype::F32,
            DtypeCode::F64 => Dtype::F64,
            DtypeCode::BF16 => Dtype::BF16,
            DtypeCode::C64 => Dtype::C64,
            other => return Err(Error::Invalid(format!("unknown dtype code {}", other.repr))),
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | C64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::BF16)
    }

    /// The safetensors name of this type (`F32`, `BF16`, ...).
    pub fn safetensors_name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "BOOL",
            U8 => "U8",
            U16 => "U16",
            U32 => "U32",
            U64 => "U64",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F16 => "F16",
            F32 => "F32",
            F64 => "F64",
            BF16 => "BF16",
            C64 => "C64",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<Dtype> {
        use Dtype::*;
        Some(match name {
            "BOOL" => Bool,
            "U8" => U8,
            "U16" => U16,
            "U32" => U32,
            "U64" => U64,
            "I8" => I8,
            "I16" => I16,
            "I32" => I32,
            "I64" => I64,
            "F16" => F16,
            "F32" => F32,
            "F64" => F64,
            "BF16" => BF16,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dtype::BF16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::C64 => "complex64",
        })
    }
}

/// Host element types that can be copied into and out of arrays.
pub trait Element: Copy + 'static {
    const DTYPE: Dtype;
}
macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(half::f16, F16);
element!(half::bf16, BF16);
element!(i32, I32);
element!(i64, I64);
element!(u32, U32);
element!(u8, U8);
element!(bool, Bool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_its_bridge_code() {
        use Dtype::*;
        for d in [Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, F32, F64, BF16, C64] {
            assert_eq!(Dtype::from_code(d.code()), Ok(d));
            assert_eq!(d.code().repr, d as u8, "{d}: the bridge code follows MLX's order");
        }
    }

    #[test]
    fn an_unknown_code_is_an_error_not_another_type() {
        let err = Dtype::from_code(DtypeCode { repr: 200 }).unwrap_err();
        assert!(err.to_string().contains("unknown dtype code 200"), "{err}");
    }
}
