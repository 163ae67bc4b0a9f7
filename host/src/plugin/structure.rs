//! The cheap structural look at a component that comes before compiling it: counts of what it
//! defines (modules, instances, memories, tables, functions, locals), read in one pass of the
//! parser without compiling anything, and checked against limits. A component far outside what
//! plugins are is refused here in milliseconds, before the compiler spends seconds and gigabytes
//! on it. (What passes still compiles in a bounded worker, see `compiler`.)

use serde::{Deserialize, Serialize};
use wasmparser::{Parser, Payload};

pub use super::limits::StructureLimits;

/// What a component defines, counted over all its (nested) modules and components.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Structure {
    pub modules: u32,
    pub core_instances: u32,
    pub component_instances: u32,
    pub memories: u32,
    pub tables: u32,
    pub functions: u32,
    /// The largest function body, in bytes.
    pub function_bytes: u32,
    /// The most locals of one function.
    pub locals: u32,
}

/// Why a component was refused before compiling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StructureError {
    #[error("not a WebAssembly component: {0}")]
    Malformed(String),
    #[error("the component defines {count} {what}, above this host's limit of {max}")]
    AboveLimit { what: String, count: u64, max: u64 },
}

/// Count what `bytes` defines. Reads every section header and each function's locals, nothing
/// more; malformed input is an error, not validated in full (the compiler does that).
pub fn measure(bytes: &[u8]) -> Result<Structure, StructureError> {
    let malformed = |e: wasmparser::BinaryReaderError| StructureError::Malformed(e.to_string());
    let mut structure = Structure::default();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::ModuleSection { .. } => structure.modules += 1,
            Payload::InstanceSection(reader) => {
                structure.core_instances = structure.core_instances.saturating_add(reader.count())
            }
            Payload::ComponentInstanceSection(reader) => {
                structure.component_instances =
                    structure.component_instances.saturating_add(reader.count())
            }
            Payload::MemorySection(reader) => {
                structure.memories = structure.memories.saturating_add(reader.count())
            }
            Payload::TableSection(reader) => {
                structure.tables = structure.tables.saturating_add(reader.count())
            }
            Payload::CodeSectionEntry(body) => {
                structure.functions = structure.functions.saturating_add(1);
                let size = u32::try_from(body.range().len()).unwrap_or(u32::MAX);
                structure.function_bytes = structure.function_bytes.max(size);
                let mut locals = 0u32;
                for declaration in body.get_locals_reader().map_err(malformed)? {
                    let (count, _) = declaration.map_err(malformed)?;
                    locals = locals.saturating_add(count);
                }
                structure.locals = structure.locals.max(locals);
            }
            _ => {}
        }
    }
    Ok(structure)
}

impl StructureLimits {
    /// Refuse a structure above any limit, naming the first.
    pub fn check(&self, structure: &Structure) -> Result<(), StructureError> {
        let pairs = [
            ("core modules", structure.modules, self.modules),
            (
                "core instances",
                structure.core_instances,
                self.core_instances,
            ),
            (
                "component instances",
                structure.component_instances,
                self.component_instances,
            ),
            ("linear memories", structure.memories, self.memories),
            ("tables", structure.tables, self.tables),
            ("functions", structure.functions, self.functions),
            (
                "bytes in its largest function body",
                structure.function_bytes,
                self.function_bytes,
            ),
            ("locals in one function", structure.locals, self.locals),
        ];
        match pairs.into_iter().find(|(_, count, max)| count > max) {
            Some((what, count, max)) => Err(StructureError::AboveLimit {
                what: what.to_string(),
                count: count.into(),
                max: max.into(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module_with_locals(locals: u32) -> Vec<u8> {
        wat::parse_str(format!(
            "(component (core module (memory 1) (func (local {})) (func)) (core instance (instantiate 0)))",
            "i32 ".repeat(locals as usize)
        ))
        .unwrap()
    }

    #[test]
    fn counts_what_a_component_defines() {
        let structure = measure(&module_with_locals(3)).unwrap();
        assert_eq!(
            structure,
            Structure {
                modules: 1,
                core_instances: 1,
                memories: 1,
                functions: 2,
                function_bytes: structure.function_bytes,
                locals: 3,
                ..Structure::default()
            }
        );
        assert!(structure.function_bytes > 0);
    }

    #[test]
    fn the_first_count_above_its_limit_is_named() {
        let limits = StructureLimits {
            locals: 2,
            ..StructureLimits::default()
        };
        let error = limits
            .check(&measure(&module_with_locals(3)).unwrap())
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the component defines 3 locals in one function, above this host's limit of 2"
        );
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(
            measure(b"\0asm\x0d\0\x01\0\xff\xff"),
            Err(StructureError::Malformed(_))
        ));
    }
}
