"""The sha256 of every decision-model file SkipVAR released, and the trust rule for pickles.

Loading a joblib/pickle file runs whatever code its author put in it: a ``.pkl`` in
``method.knobs.decision_models`` is loaded only when its bytes are one of the released files
below, or when the user says they trust it (``method.knobs.trust_decision_models=true``, or the
environment variable ``VARBENCH_TRUST_DECISION_MODELS=1`` for every job of a shell or a cluster
script). The folders varbench trains itself (``python -m experiments.skipvar_train``) are written
in skops' format (``*.skops``), which loads without running code (see
:func:`varbench.policies.skipvar_features.load_decision_models`).

Source of the table: fakerone-li/SkipVAR @ 607be0e (the commit the method card cites), folder
``SkipVAR/decision_model_*``: the sha256 of each blob as stored in that commit, computed from a
mirror of the repository (the files themselves are not shipped with varbench). Identical scaler
files appear in several folders (``skip_model_scaler.pkl`` of 84/86/88): the release reused them.
"""
from __future__ import annotations

import os
from typing import Mapping

#: released folder -> {file name: sha256}, fakerone-li/SkipVAR @ 607be0e, SkipVAR/<folder>/
RELEASED_SHA256: dict[str, dict[str, str]] = {
    "decision_model_ssim_84": {
        "skip_model_Decision_Tree.pkl": "dc90569601f34bbee84f2245c203638b5e99f7ac37f8db9b595d7f2bcdd64951",
        "skip_model_Logistic_Regression.pkl": "58160e6800096f0ef8d4a1742a86c6b4422cc54656c1d9accd8cd9622ddb3da9",
        "skip_model_Random_Forest.pkl": "b546821fcc9f2eff4f019bd67641e085633e2682d97ff485e74ad5fbb042fcf5",
        "skip_model_scaler.pkl": "878dfb1086b4b563b2cd7c0eeed1683118811b4655f551e682cadaeae0b093cf",
        "uncond_model_Decision_Tree.pkl": "5f1c6ce83e763d7a9d97b968e33f70e4b4f9fa1e57fb574b03ee7137f97942ed",
        "uncond_model_Logistic_Regression.pkl": "dff86bb52920736c77932ce9ca6851116326bacc79bc42b79131af49f9ddc07d",
        "uncond_model_Random_Forest.pkl": "4265bc617eae926f5eeeb884cae0ab7259a0763a0d810a25eb5ae18b7409002c",
        "uncond_model_scaler.pkl": "686d0ae76dd8c0422e72e8e99a01a4db4ef05a227e4dfaa750fa3ba5f3bed416",
    },
    "decision_model_ssim_84_diff_only": {
        "skip_model_Decision_Tree.pkl": "5dd96817ef3980b83e4ea93f663f2daa89203b989c5173986b43d99119cb7365",
        "skip_model_Logistic_Regression.pkl": "013a6e3cc366644f8aa10257f03abbed19d79921c7c41ba8c00077ab4a9e82ad",
        "skip_model_Random_Forest.pkl": "bf94b03c884f18936c4e1af39f24a237462f270bb02643789b72a7f17fec0849",
        "skip_model_scaler.pkl": "62f9c93fbba17e78aff68128cca1cc979ab9e4344b2f9fd71b28d22d516e138b",
        "uncond_model_Decision_Tree.pkl": "21a867721c6f9c0c7009c36a8fcd4ba69b2c434dc2937ed011c53a21ba9dac86",
        "uncond_model_Logistic_Regression.pkl": "2579db65f05a416797d1eb4472848816cdc13893377c996c83e7799f9fa65699",
        "uncond_model_Random_Forest.pkl": "9349ccd085300c3d0491f121c0672b273ba4bf30138f7188fd4678ed58fbdb8d",
        "uncond_model_scaler.pkl": "4a6628e3684aeda9383e166bc187f99526fc3e95869540fa0daa4af904325453",
    },
    "decision_model_ssim_86": {
        "skip_model_Decision_Tree.pkl": "decfea65adb572d6aaff8754ff7062394583609f706c00bdc3cb9d3110fccbd3",
        "skip_model_Logistic_Regression.pkl": "65fb55613690b95863957c2132faf40d6622eed1f8b985eec0c5195663db58df",
        "skip_model_Random_Forest.pkl": "39b9827d6a1e0233ff3e3ece738047bec9c33933b324612ca5e649857d7b6b99",
        "skip_model_scaler.pkl": "878dfb1086b4b563b2cd7c0eeed1683118811b4655f551e682cadaeae0b093cf",
        "uncond_model_Decision_Tree.pkl": "dde240e8f2f8dd38e5ff1d8ed387f7c74c96ac862caeec33276681617429c487",
        "uncond_model_Logistic_Regression.pkl": "339e82cc46d890b944ad7643b7b27226a2eb37e96a797ebc2d5d69b0b3574fcb",
        "uncond_model_Random_Forest.pkl": "88343c59458294a23b53de0f97c0d198091d12e2c4c6b335a7b7aaa2d762d675",
        "uncond_model_scaler.pkl": "e8226b598ebc35933d910cfcd3693fd1ff5e2a8e92ffa45c1337c1ffeadf5b64",
    },
    "decision_model_ssim_88": {
        "skip_model_Decision_Tree.pkl": "1dc3fe94999cd2a101461629a6f03c3ee7f0fc567df2f44cae2ac61627332747",
        "skip_model_Logistic_Regression.pkl": "2252d0dcd640cc0430e27eabfe12d11b42d6a8c15700e5cd4764d0ed5e0e40df",
        "skip_model_Random_Forest.pkl": "3f4c42af2a8d4902f7dc2edb9fb171b7d91d018674ce163f50000f255e93d479",
        "skip_model_scaler.pkl": "878dfb1086b4b563b2cd7c0eeed1683118811b4655f551e682cadaeae0b093cf",
        "uncond_model_Decision_Tree.pkl": "37abbc127d3e2ad1dc7fecfe5120664bc9341bfe51c7d9dba997c7801eef9b7b",
        "uncond_model_Logistic_Regression.pkl": "550d524e29889ebc24765e15c4a9b6e052da781174af79042630f56c1f28a57c",
        "uncond_model_Random_Forest.pkl": "25791854aabd3e5aee9554dad08f1fcd2cec248eaaf5d5b6a4110315fb1ce9f2",
        "uncond_model_scaler.pkl": "c4960be8a54dae1323d07cac254e7c84b193ec1b0bdd713ede08244ee55d34ad",
    },
}

#: set to 1 / true / yes to load decision-model pickles that match no released file (they run code)
TRUST_ENV = "VARBENCH_TRUST_DECISION_MODELS"


def trusted_by_env() -> bool:
    """Whether :data:`TRUST_ENV` says to trust unknown decision-model pickles."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def released_folder(hashes: Mapping[str, str]) -> str | None:
    """The released folder whose files are exactly these bytes (``{file name: sha256}``), else None.

    Every file must match the same folder: a folder mixing files of two releases would not be one."""
    for folder, pinned in RELEASED_SHA256.items():
        if hashes and all(pinned.get(name) == sha for name, sha in hashes.items()):
            return folder
    return None
