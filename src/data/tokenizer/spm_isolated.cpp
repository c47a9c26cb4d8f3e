// The dlopen/dlsym half of spm_isolated.h. The header sentencepiece_processor.h is included only
// for sizes checked at compile time; no sentencepiece symbol is referenced at link time (one
// reference would put the library back into the global scope and bring the crash back).
//
// Calls go through the exported C++ symbols with their Itanium-mangled names. A member function is
// called as a free function taking `this` first; functions returning util::Status return a
// StatusBox, which like Status is one pointer with a non-trivial destructor, so the compiler
// passes the return slot exactly as for Status on every Itanium-ABI target (x86-64, aarch64).
#include "data/tokenizer/spm_isolated.h"

#include <dlfcn.h>
#include <sentencepiece_processor.h>

#include <new>

#include "util/error.h"

namespace shardlm::data::spm {
namespace {

using sentencepiece::SentencePieceProcessor;
static_assert(sizeof(sentencepiece::util::Status) == sizeof(void*),
              "util::Status is no longer one pointer; StatusBox below must follow it");
static_assert(alignof(SentencePieceProcessor) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

struct StatusBox;
using StatusDtorFn = void (*)(StatusBox*);
using StatusMessageFn = const char* (*)(const StatusBox*);

struct Api {
  void (*ctor)(void* self);
  void (*dtor)(void* self);
  StatusBox (*load)(void* self, std::string_view path);
  StatusBox (*encode)(const void* self, std::string_view text, std::vector<int>* ids);
  StatusBox (*decode)(const void* self, const std::vector<int>& ids, std::string* text);
  int (*piece_size)(const void* self);
  int (*bos_id)(const void* self);
  int (*eos_id)(const void* self);
  StatusDtorFn status_dtor;
  StatusMessageFn status_message;
  void (*set_min_log_level)(int level);
};

const Api& api();

// Mirrors sentencepiece::util::Status: null means OK, otherwise an owned Rep the library frees.
struct StatusBox {
  void* rep = nullptr;
  StatusBox() = default;
  StatusBox(const StatusBox&) = delete;
  StatusBox& operator=(const StatusBox&) = delete;
  ~StatusBox() {
    if (rep != nullptr) api().status_dtor(this);
  }
  std::string message() const {
    if (rep == nullptr) return {};
    const char* m = api().status_message(this);
    return m != nullptr && *m != '\0' ? m : "unknown sentencepiece error";
  }
};

void* open_library(const char* name) {
  // RTLD_LOCAL keeps it out of the global scope; RTLD_DEEPBIND makes it (and the dependencies this
  // call loads) prefer their own definitions, i.e. sentencepiece's protobuf, over libtorch's.
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    fail("cannot load ", name, ": ", dlerror(),
         "; install Debian's libsentencepiece0 (scripts/setup.sh installs libsentencepiece-dev)");
  }
  return h;
}

template <typename Fn>
void bind(void* lib, const char* lib_name, const char* symbol, Fn* out) {
  void* p = dlsym(lib, symbol);
  if (p == nullptr) {
    fail(lib_name, " lacks ", symbol, "; shardlm was written against sentencepiece 0.1.97 ",
         "(Debian 12); install that version or update src/data/tokenizer/spm_isolated.cpp");
  }
  *out = reinterpret_cast<Fn>(p);
}

Api load_api() {
  Api a{};
  const char* core = "libsentencepiece.so.0";
  void* lib = open_library(core);
  bind(lib, core, "_ZN13sentencepiece22SentencePieceProcessorC1Ev", &a.ctor);
  bind(lib, core, "_ZN13sentencepiece22SentencePieceProcessorD1Ev", &a.dtor);
  bind(lib, core, "_ZN13sentencepiece22SentencePieceProcessor4LoadESt17basic_string_viewIcSt11char_traitsIcEE",
       &a.load);
  bind(lib, core,
       "_ZNK13sentencepiece22SentencePieceProcessor6EncodeESt17basic_string_viewIcSt11char_traitsIcEEPSt6vectorIiSaIiEE",
       &a.encode);
  bind(lib, core,
       "_ZNK13sentencepiece22SentencePieceProcessor6DecodeERKSt6vectorIiSaIiEEPNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
       &a.decode);
  bind(lib, core, "_ZNK13sentencepiece22SentencePieceProcessor12GetPieceSizeEv", &a.piece_size);
  bind(lib, core, "_ZNK13sentencepiece22SentencePieceProcessor6bos_idEv", &a.bos_id);
  bind(lib, core, "_ZNK13sentencepiece22SentencePieceProcessor6eos_idEv", &a.eos_id);
  bind(lib, core, "_ZN13sentencepiece4util6StatusD1Ev", &a.status_dtor);
  bind(lib, core, "_ZNK13sentencepiece4util6Status13error_messageEv", &a.status_message);
  bind(lib, core, "_ZN13sentencepiece7logging14SetMinLogLevelEi", &a.set_min_log_level);
  // Deep binding also binds sentencepiece's std::cerr to libstdc++'s own, never-constructed copy
  // (the program's copy-relocated one is the live stream), so its logging must stay off; it
  // reports errors through util::Status anyway. Level 3 keeps only FATAL, which dies regardless.
  a.set_min_log_level(3);
  return a;
}

// Loaded once per process and never unloaded (sentencepiece keeps global state).
const Api& api() {
  static const Api a = load_api();
  return a;
}

}  // namespace

Processor::Processor() : self_(nullptr) {
  const Api& a = api();
  self_ = ::operator new(sizeof(SentencePieceProcessor));
  a.ctor(self_);
}

Processor::~Processor() {
  api().dtor(self_);
  ::operator delete(self_);
}

std::string Processor::load(const std::string& model_path) {
  return api().load(self_, model_path).message();
}

std::string Processor::encode(std::string_view text, std::vector<int>* ids) const {
  return api().encode(self_, text, ids).message();
}

std::string Processor::decode(const std::vector<int>& ids, std::string* text) const {
  return api().decode(self_, ids, text).message();
}

int Processor::piece_size() const { return api().piece_size(self_); }
int Processor::bos_id() const { return api().bos_id(self_); }
int Processor::eos_id() const { return api().eos_id(self_); }

}  // namespace shardlm::data::spm
