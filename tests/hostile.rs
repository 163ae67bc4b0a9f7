//! Components patched by hand, as an attacker would: a plugin built like the others, with core
//! modules and instances appended that no SDK would write. Each targets one resource the host
//! spends on a component before or while running it (compilation, memories, core instances).
//!
//! Only sections are appended, so every index the plugin already uses stays valid and the result
//! still exports a working plugin.

use wasm_encoder::{
    CodeSection, Component, Function, FunctionSection, InstanceSection, Instruction, MemorySection,
    MemoryType, Module, ModuleSection, RawSection, TypeSection, ValType,
};
use wasmparser::{ComponentExternalKind, ComponentOuterAliasKind, Parser, Payload};

/// What to append to a plugin.
#[derive(Clone, Copy, Debug)]
pub enum Patch {
    /// A core module whose one function is built to make the compiler's register allocator spend
    /// time and memory: `loops` nested loops, all `locals` i64 locals read and written in the
    /// innermost, so every loop header joins every local.
    CompileBomb { locals: u32, loops: u32 },
    /// `count` modules of one memory of `pages` 64 KiB pages each, instantiated once each.
    Memories { count: u32, pages: u64 },
    /// An empty core module instantiated `count` times.
    CoreInstances { count: u32 },
}

/// `component` with `patch` appended.
pub fn patched(component: &[u8], patch: Patch) -> Vec<u8> {
    let mut out = Component::new();
    let mut core_modules = 0u32;
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.expect("the plugin is a valid component");
        if let Payload::End(_) = payload {
            if depth == 0 {
                break;
            }
            depth -= 1;
            continue;
        }
        if depth == 0 {
            match &payload {
                Payload::ModuleSection { .. } => core_modules += 1,
                Payload::ComponentAliasSection(reader) => {
                    for alias in reader.clone() {
                        let is_module = match alias.expect("a valid alias") {
                            wasmparser::ComponentAlias::InstanceExport { kind, .. } => {
                                kind == ComponentExternalKind::Module
                            }
                            wasmparser::ComponentAlias::Outer { kind, .. } => {
                                kind == ComponentOuterAliasKind::CoreModule
                            }
                            wasmparser::ComponentAlias::CoreInstanceExport { .. } => false,
                        };
                        core_modules += u32::from(is_module);
                    }
                }
                _ => {}
            }
            if let Some((id, range)) = payload.as_section() {
                out.section(&RawSection {
                    id,
                    data: &component[range],
                });
            }
        }
        if matches!(
            payload,
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. }
        ) {
            depth += 1;
        }
    }
    match patch {
        Patch::CompileBomb { locals, loops } => {
            out.section(&ModuleSection(&bomb_module(locals, loops)));
        }
        Patch::Memories { count, pages } => {
            let mut module = Module::new();
            let mut memories = MemorySection::new();
            memories.memory(MemoryType {
                minimum: pages,
                maximum: None,
                memory64: false,
                shared: false,
                page_size_log2: None,
            });
            module.section(&memories);
            let mut instances = InstanceSection::new();
            for index in 0..count {
                out.section(&ModuleSection(&module));
                instances.instantiate(core_modules + index, Vec::<(&str, _)>::new());
            }
            out.section(&instances);
        }
        Patch::CoreInstances { count } => {
            out.section(&ModuleSection(&Module::new()));
            let mut instances = InstanceSection::new();
            for _ in 0..count {
                instances.instantiate(core_modules, Vec::<(&str, _)>::new());
            }
            out.section(&instances);
        }
    }
    out.finish()
}

/// A module of one function `() -> i64` (never called: compiling it is the attack): `locals` i64
/// locals, `loops` nested loops, every local rewritten in the innermost, and a conditional branch
/// back to each loop header.
fn bomb_module(locals: u32, loops: u32) -> Module {
    let mut types = TypeSection::new();
    types.ty().function([], [ValType::I64]);
    let mut functions = FunctionSection::new();
    functions.function(0);
    let mut body = Function::new([(locals, ValType::I64)]);
    for _ in 0..loops {
        body.instruction(&Instruction::Loop(wasm_encoder::BlockType::Empty));
    }
    for local in 0..locals {
        body.instruction(&Instruction::LocalGet(local))
            .instruction(&Instruction::LocalGet((local + 1) % locals))
            .instruction(&Instruction::I64Add)
            .instruction(&Instruction::LocalSet(local));
    }
    for depth in 0..loops {
        body.instruction(&Instruction::LocalGet(depth % locals))
            .instruction(&Instruction::I64Const(1))
            .instruction(&Instruction::I64LtS)
            .instruction(&Instruction::BrIf(depth));
    }
    for _ in 0..loops {
        body.instruction(&Instruction::End);
    }
    body.instruction(&Instruction::LocalGet(0));
    body.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&body);
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&code);
    module
}
