// The whole protocol in one include: atoms, messages, errors, announcement.
#pragma once

#include "actors/protocol/announce.hpp"
#include "actors/protocol/atoms.hpp"
#include "actors/protocol/errors.hpp"
#include "actors/protocol/messages.hpp"
