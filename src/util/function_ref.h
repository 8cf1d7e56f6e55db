// FunctionRef<R(Args...)> — a non-owning reference to a callable, for parameters of functions that
// call it before returning (ThreadPool::parallel_for, a layer's mixer callback).
//
// Unlike std::function it never allocates, whatever the callable captures (a decode step makes
// hundreds of such calls and must not touch the heap). The callable must outlive every call made
// through the reference: pass a lambda at the call site, never keep a FunctionRef to a temporary.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace strata {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class Fn>
    requires(!std::is_same_v<std::remove_cvref_t<Fn>, FunctionRef> &&
             std::is_invocable_r_v<R, Fn&, Args...>)
  FunctionRef(Fn&& fn)  // NOLINT(google-explicit-constructor): callables convert at the call site
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(fn)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<Fn>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace strata
