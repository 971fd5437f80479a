// libmuster.so: the engine (muster_engine, linked whole) behind
// include/muster/muster.h, with gRPC, Gloo and the rest linked inside. This
// file only anchors the shared library; the code lives in engine.cc.
#include "muster/muster.h"
